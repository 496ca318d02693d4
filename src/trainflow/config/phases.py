"""A campaign in phases (docs/phases.md): an ordered list, each a name and Hydra overrides over the experiment, such as
pre-training, context extension and annealing. Composing phase k composes phases 0..k too: their checkpoint series'
names chain (phase k's series is named by its parent's, its own name and a digest of what defines it), and an
architecture no checkpoint can carry from one phase into the next is refused in one line.

    python -c "from trainflow.config import compose; c = compose('train_segment', ['experiment=smoke', 'phase=long']); \
        print([(p.name, p.series) for p in c.phases])"

What defines phase k's series: its parent's series, the parent's plan (train.segments and train.segment_steps: where
it ends), from_step, and its own overrides but the ones that only extend it (train.segments). So extending the parent
or editing phase k's overrides starts a new series for phase k (and the phases after it) from the parent's last
checkpoint, the earlier phases untouched; extending phase k itself continues its series; and the command line's
overrides, which apply to every phase, are settings like any other (config.identity), changing no series. Which step
phase k starts at is read from its parent's lineage when it trains (trainflow.campaign.segments.start_point).
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable, Sequence

from omegaconf import DictConfig, OmegaConf

from trainflow.config.hashing import section
from trainflow.config.identity import identity, plain_series_name
from trainflow.config.override_words import check
from trainflow.config.schema import TrainflowConfig
from trainflow.errors import ConfigError

CARRIED = (
    "model.rope_theta",
    "model.rope_scaling",
    "model.rope_factor",
    "model.rope_low_freq_factor",
    "model.rope_high_freq_factor",
    "model.rope_original_seq_len",
    "model.init_std",
    "io.init_from",
)
"""The identity's keys a phase may change against its parent: what the weights compute positions with (rotary
scaling, Llama 3's context extension), how a model is initialised (a later phase starts from its parent's weights).
The sequence length is a setting anyway; every other key (shapes, vocabulary, tokenizer) no checkpoint carries."""
EXTENDS = ("train.segments",)
"""A phase's overrides that only extend it: left out of its series' digest."""
NOT_IN_PHASE = ("phases", "phase", "run", "stage", "job", "segment", "io", "storage", "train.branch_from")
"""What a phase's overrides may not set: the phases themselves, which job this is, where the run is, and where it
starts (its parent's last checkpoint, or from_step)."""


def phase_index(cfg: TrainflowConfig) -> int:
    """The position of cfg.phase among cfg.phases (0: the first, or no phases)."""
    names = [p.name for p in cfg.phases]
    return names.index(cfg.phase) if cfg.phase in names else 0


def phase_arg(cfg: TrainflowConfig) -> str:
    """The phase= override that gives a stage `cfg`'s phase ('' without phases): the workflow's rules add it."""
    return f"phase={cfg.phase}" if cfg.phase else ""


def compose_phase(
    config_name: str, overrides: Sequence[str], raw: DictConfig, compose_raw: Callable[..., DictConfig]
) -> DictConfig:
    """The raw config of the phase `raw` names (phase=; '' the first), its phases' series and segments filled in."""
    phases = list(raw.phases)
    names = [str(p.name) for p in phases]
    if len(set(names)) < len(names):
        twice = next(n for n in names if names.count(n) > 1)
        raise ConfigError(f"phases name {twice!r} twice: give every phase a name of its own")
    want = str(raw.phase) or names[0]
    if want not in names:
        raise ConfigError(f"phase({want!r}) is none of the campaign's phases ({', '.join(names)}): name one of them")
    chain: list[tuple[TrainflowConfig, str]] = []
    for i, phase in enumerate(phases[: names.index(want) + 1]):
        words = [str(w) for w in phase.overrides]
        for word in words:
            check_phase_override(phase.name, word)
        try:
            composed = compose_raw(config_name, [*words, *overrides])
        except ConfigError as err:
            raise ConfigError(f"phase {phase.name}: {err}") from None
        cfg = structured(composed)
        if i == 0:
            series = plain_series_name(cfg)
        else:
            parent, series_before = chain[-1]
            check_carried(phase.name, names[i - 1], parent, cfg)
            check_tokens(phase.name, names[0], chain[0][0], cfg)
            series = f"{series_before}-{phase.name}-{digest(series_before, parent, int(phase.from_step), words)}"
        chain.append((cfg, series))
    out = composed
    for i, (cfg, series) in enumerate(chain):
        out.phases[i].series, out.phases[i].segments = series, cfg.train.segments
    out.phase = want
    if len(chain) > 1:
        out.train.branch_from = ""  # a later phase starts from its parent: the command line's branch is the first's
    return out


def structured(raw: DictConfig) -> TrainflowConfig:
    """The dataclass tree of a raw config, as is (no io paths, no checks: to_config does those for the phase run)."""
    raw = OmegaConf.masked_copy(raw, [k for k in raw if k != "hydra"]) if "hydra" in raw else raw
    cfg = OmegaConf.to_object(raw)
    assert isinstance(cfg, TrainflowConfig)
    return cfg


def check_phase_override(name: str, word: str) -> None:
    """One phase override as safe as a command line's (config.overrides.check), and none of NOT_IN_PHASE."""
    check(word, f"phase {name}")
    key = word.partition("=")[0].lstrip("+~")
    if any(key == k or key.startswith(f"{k}.") for k in NOT_IN_PHASE):
        raise ConfigError(
            f"phase {name} override {word!r} sets {key}, which a phase does not choose (it starts from its parent's "
            "last checkpoint, or phases[].from_step; paths and the run are the campaign's): drop it from the phase"
        )


def check_carried(name: str, parent_name: str, parent: TrainflowConfig, cfg: TrainflowConfig) -> None:
    """One ConfigError where phase `name` trains a model its parent's checkpoint cannot carry (other widths)."""
    before, after = identity(parent), identity(cfg)
    for key in sorted({*before, *after} - set(CARRIED)):
        if before.get(key) != after.get(key):
            raise ConfigError(
                f"phase {name}: {key}({after.get(key)!r}) but phase {parent_name} trains {key}={before.get(key)!r}: "
                f"no checkpoint carries that into the next phase; keep it in every phase (a phase may change the "
                f"sequence length and {', '.join(k for k in CARRIED if k.startswith('model.rope'))}), or start a new "
                "campaign with run=<new name>"
            )


def check_tokens(name: str, first_name: str, first: TrainflowConfig, cfg: TrainflowConfig) -> None:
    """One ConfigError where phase `name` reads data the campaign does not tokenise: prepare_data and stage_data run
    once, for the first phase's data; a later phase may weigh its sources anew (an annealing mixture), not add any."""
    mine, theirs = section(cfg, "tokens"), section(first, "tokens")
    if mine != theirs:
        key = next(k for k in sorted({*mine, *theirs}) if mine.get(k) != theirs.get(k))
        raise ConfigError(
            f"phase {name}: data.{key}({mine.get(key)!r}) but the campaign tokenises phase {first_name}'s "
            f"data.{key}={theirs.get(key)!r}: list every source in the experiment's data.sources and give each phase "
            "its weights (a weight of 0 leaves a source out of a phase's batches)"
        )


def digest(parent_series: str, parent: TrainflowConfig, from_step: int, words: list[str]) -> str:
    """What defines a later phase's series besides its parent's name (module docstring), as 8 hex digits."""
    own = [w for w in words if w.partition("=")[0].lstrip("+~") not in EXTENDS]
    blob = {
        "parent": parent_series,
        "parent_plan": [parent.train.segments, parent.train.segment_steps],
        "from_step": from_step,
        "overrides": own,
    }
    return hashlib.sha256(json.dumps(blob, sort_keys=True).encode()).hexdigest()[:8]
