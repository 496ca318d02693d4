"""A campaign's identity apart from how it is executed: what makes its checkpoints a different model (the identity,
which names the checkpoint series) against everything else, how the next steps run (the settings, which a segment
records and may change). docs/runs.md has the table.

    python -c "from trainflow.config import compose; from trainflow.config.identity import identity, settings; \
        c = compose('train_segment'); print(identity(c)); print(len(settings(c)))"

The identity: the architecture (every model.* field but its name and seq_len: the shapes, vocabulary, rotary
scaling, tied embeddings, norm epsilon and initialisation scale), the tokenizer (its kind and vocabulary, the file of a
pretrained one, what trains a BPE), the initialisation (io.init_from) and, kept apart, the seed. The series is named
by the first three (series_key), under the run's name; the seed is recorded with the series and checked against it
(trainflow.campaign), so a branch (train.branch_from) may draw its data with another seed. Everything else is a
setting: the optimizer and schedule, the batch and sequence length, segments and their length, the layout, cluster,
allocation, hardware and MTBF estimates, resilience, checkpoint interval and mode, precision, fp8, compile, recompute,
evaluation cadence, the data and its mixture's weights. A setting applies from the first segment not yet completed.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import re
from typing import Any

from omegaconf import OmegaConf

from trainflow.config.domain import SERIES
from trainflow.config.schema import ModelConfig, TrainflowConfig
from trainflow.errors import ConfigError
from trainflow.records import Record

ARCHITECTURE = tuple(f.name for f in dataclasses.fields(ModelConfig) if f.name not in ("name", "seq_len"))
"""model.*'s identity: all but the preset's label and the sequence length (a setting: longer sequences train on from
the same weights)."""
BPE_READS = ("corpus", "text_field", "bad_lines", "max_bytes", "bpe_sample_bytes", "shards", "sources")
"""What prepare_data's tokenizer job trains a BPE from (data.tokenizer=bpe): another sample is another vocabulary."""
SEED = "train.seed"
NOT_SETTINGS = ("run", "stage", "job", "segment", "io", "storage", "phases", "phase")
"""What a segment's settings leave out: where the run is and which job this is, not how it trains (a phase's overrides
are in the settings they set; its series is named by them: config.phases)."""
BRANCH = re.compile(rf"(?:(?P<series>{SERIES})@)?(?P<step>[0-9]+)")
"""train.branch_from: STEP (from the campaign's main series) or SERIES@STEP (from a branch or phase of it)."""


def as_dict(node: Any) -> Any:
    """A plain dict of a config dataclass (or subtree)."""
    return OmegaConf.to_container(OmegaConf.structured(node), resolve=True)


@dataclasses.dataclass(frozen=True)
class Change(Record):
    """One setting a segment changed against the segment (or checkpoint) it continued from."""

    key: str
    before: Any
    """None: the setting was not recorded then (a new one, or the first segment)."""
    after: Any

    def line(self) -> str:
        return f"{self.key} {json.dumps(self.before)} -> {json.dumps(self.after)}"


def identity(cfg: TrainflowConfig) -> dict[str, Any]:
    """What makes the series' checkpoints a different model (the seed aside: SEED), by dotted key."""
    m, d = cfg.model, cfg.data
    ident: dict[str, Any] = {f"model.{k}": getattr(m, k) for k in ARCHITECTURE}
    ident |= {"data.tokenizer": d.tokenizer, "data.vocab_size": d.vocab_size}
    if d.tokenizer == "pretrained":
        ident["data.tokenizer_path"] = d.tokenizer_path
    if d.tokenizer == "bpe":
        data = as_dict(d)
        data["sources"] = [{k: v for k, v in s.items() if k != "weight"} for s in data["sources"]]
        ident |= {f"data.{k}": data[k] for k in BPE_READS}
    ident["io.init_from"] = cfg.io.init_from
    return ident


def series_key(cfg: TrainflowConfig) -> str:
    """The main series' name: a short hash of the identity (without the seed)."""
    return hashlib.sha256(json.dumps(identity(cfg), sort_keys=True).encode()).hexdigest()[:12]


def branch_point(cfg: TrainflowConfig) -> tuple[str, int] | None:
    """train.branch_from as (the parent series, the step), None where it is empty; one ConfigError where it names
    neither a step nor a series of this campaign."""
    spec = cfg.train.branch_from
    if not spec:
        return None
    key, match = series_key(cfg), BRANCH.fullmatch(spec)
    if not match or not (match["series"] or key).startswith(key):
        raise ConfigError(
            f"train.branch_from({spec!r}) must be a step (train.branch_from=300, from the main series {key}) or "
            f"SERIES@STEP with a series of this campaign (one whose name starts with {key}, e.g. {key}-b300@450)"
        )
    return match["series"] or key, int(match["step"])


def series_name(cfg: TrainflowConfig) -> str:
    """The checkpoint series the config trains: its phase's (config.phases: set by compose) after the first, else
    plain_series_name."""
    names = [p.name for p in cfg.phases]
    if cfg.phase in names[1:]:
        return cfg.phases[names.index(cfg.phase)].series
    return plain_series_name(cfg)


def plain_series_name(cfg: TrainflowConfig) -> str:
    """The main series (series_key), or a branch of it named by its parent and step (<parent>-b<step>), so every
    branch of a branch reads back to the main series."""
    point = branch_point(cfg)
    return series_key(cfg) if point is None else f"{point[0]}-b{point[1]}"


def settings(cfg: TrainflowConfig) -> dict[str, Any]:
    """How the next steps run: every setting but the identity's, by dotted key (lists as values)."""
    tree = {k: v for k, v in as_dict(cfg).items() if k not in NOT_SETTINGS}
    ident = {*identity(cfg), SEED, "train.branch_from"}
    return {k: v for k, v in flatten(tree).items() if k not in ident}


def flatten(tree: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in tree.items():
        if isinstance(value, dict):
            out |= flatten(value, f"{prefix}{key}.")
        else:
            out[f"{prefix}{key}"] = value
    return out


def changes(before: dict[str, Any] | None, after: dict[str, Any]) -> list[Change]:
    """The settings `after` changed against `before` (None: nothing recorded to compare with: no change)."""
    if before is None:
        return []
    keys = sorted(set(before) | set(after))
    return [Change(k, before.get(k), after.get(k)) for k in keys if before.get(k) != after.get(k)]
