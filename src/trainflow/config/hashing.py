"""What reruns what: the config subtrees each stage reads, and their hash (each rule's params).

python -c "from trainflow.config import compose, config_hash; print(config_hash(compose('report'), ('model',)))"
"""

from __future__ import annotations

import hashlib
import json
from typing import Any

from omegaconf import OmegaConf

from trainflow.config.schema import TrainflowConfig

# The config subtrees each stage reads: their hash is the rule's params, so a change reruns exactly
# the stages that read it (and, through their outputs, what follows).
STAGE_READS: dict[str, tuple[str, ...]] = {
    "prepare_data": ("data",),
    "stage_data": ("data",),
    "validate_nccl": ("parallel", "cluster", "model", "train", "checkpoint", "energy"),  # and the plan
    "train_segment": ("model", "data", "parallel", "optim", "train", "checkpoint", "cluster"),
    "verify_checkpoint": (),
    "account_energy": ("energy", "cluster"),
    "report": ("model", "parallel", "train", "cluster", "energy", "observe"),
}


def as_dict(node: Any) -> Any:
    """A plain dict of a config dataclass (or subtree)."""
    return OmegaConf.to_container(OmegaConf.structured(node), resolve=True)


def config_hash(cfg: TrainflowConfig, sections: tuple[str, ...]) -> str:
    """A short stable hash of the named config subtrees."""
    blob = json.dumps({s: as_dict(getattr(cfg, s)) for s in sections}, sort_keys=True)
    return hashlib.sha256(blob.encode()).hexdigest()[:12]
