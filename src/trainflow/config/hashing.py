"""What reruns what: the hash of the config subtrees a stage reads (config.stages.STAGE_READS), its rule's params.

python -c "from trainflow.config import compose, config_hash; print(config_hash(compose('report'), ('model',)))"
"""

from __future__ import annotations

import hashlib
import json
from typing import Any

from trainflow.config.identity import as_dict, series_name
from trainflow.config.schema import TrainflowConfig
from trainflow.config.stages import SERIES, STAGE_READS, UNHASHED


def section(cfg: TrainflowConfig, name: str) -> Any:
    """A config subtree as a plain dict; `tokens` is data without the sources' weights, what tokenising reads (a new
    mixture of the same corpora draws from the same shards); `series` the checkpoint series' name (config.identity:
    what training's and verification's outputs are, not how they were computed)."""
    if name == SERIES:
        return series_name(cfg)
    if name != "tokens":
        return as_dict(getattr(cfg, name))
    data = as_dict(cfg.data)
    data["sources"] = [{k: v for k, v in s.items() if k != "weight"} for s in data["sources"]]
    return data


def config_hash(cfg: TrainflowConfig, sections: tuple[str, ...]) -> str:
    """A short stable hash of the named config subtrees, without the UNHASHED settings."""
    return tree_hash({s: section(cfg, s) for s in sections})


def tree_hash(tree: dict[str, Any]) -> str:
    """A short stable hash of config subtrees (plain dicts by section), without the UNHASHED settings."""
    for path in UNHASHED:
        *parents, leaf = path.split(".")
        node = tree
        for key in parents:
            node = node.get(key, {})
        node.pop(leaf, None)
    blob = json.dumps(tree, sort_keys=True)
    return hashlib.sha256(blob.encode()).hexdigest()[:12]


def stage_hash(cfg: TrainflowConfig, stage: str) -> str:
    """The hash of what `stage` reads: its rule's params, so a change there reruns it and what follows."""
    return config_hash(cfg, STAGE_READS[stage])
