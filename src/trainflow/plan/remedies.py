"""What each of the seed's remedies changes: the plan again with one change applied (tree vs ring all-reduce,
interleaved 1F1B vs 1F1B, twice the microbatches, FP8 matmuls) and, where tp spans nodes, tp inside a node.

    python -c "from trainflow.config import compose; from trainflow.plan.remedies import remedies; \
        [print(r.name, r.step and r.step.tokens_per_s_per_device) for r in remedies(compose('train_segment', \
        ['experiment=llama70b_alps', 'train.precision=bf16', 'train.activations=recompute']))]"

A change is a set of config overrides applied to a copy of the composed config and validated as
training validates it; one the layout rules refuse is listed with the reason instead of a plan.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass

from trainflow.config.checks import validate
from trainflow.config.schema import TrainflowConfig
from trainflow.errors import ConfigError
from trainflow.plan.core import plan_core
from trainflow.plan.setup import PlanSetup
from trainflow.plan.step import StepPlan
from trainflow.records import Record


def changes(cfg: TrainflowConfig, setup: PlanSetup) -> list[tuple[str, dict[str, object], bool]]:
    """(name, overrides, fp8) of every remedy that applies to this config."""
    p, t, c = cfg.parallel, cfg.train, cfg.cluster
    other = "ring" if c.hardware.allreduce_algorithm == "tree" else "tree"
    out: list[tuple[str, dict[str, object], bool]] = [
        (f"{other} all-reduce", {"cluster.hardware.allreduce_algorithm": other}, False)
    ]
    if p.pp > 1 and p.schedule == "interleaved_1f1b":
        out.append(("1F1B instead of interleaved", {"parallel.schedule": "1f1b", "parallel.virtual_stages": 1}, False))
    elif p.pp > 1:
        out.append(
            ("interleaved 1F1B, v=2", {"parallel.schedule": "interleaved_1f1b", "parallel.virtual_stages": 2}, False)
        )
    if p.pp > 1:
        m = 2 * p.microbatches
        batch = t.global_batch if t.global_batch % (p.dp * m) == 0 else 2 * t.global_batch
        out.append((f"{m} microbatches", {"parallel.microbatches": m, "train.global_batch": batch}, False))
    # FP8 is switched on as training would run it (validated: fp8_errors refuses a linear whose share on one tp
    # rank breaks the 16-multiple rule, or fp32 training); one already on is the plan again at fp8's speed.
    out.append(("FP8 matmuls", {} if t.fp8 != "none" else {"train.fp8": "delayed"}, True))
    per_node = setup.ranks_per_node
    if p.tp > per_node > 1 and p.tp % per_node == 0:
        dp = p.dp * p.tp // per_node
        m = max(p.pp, t.global_batch // dp) if p.pp > 1 else 1
        out.append(
            (
                f"tp inside a node (tp{per_node})",
                {"parallel.tp": per_node, "parallel.dp": dp, "parallel.microbatches": m},
                False,
            )
        )
    return out


def apply(cfg: TrainflowConfig, overrides: dict[str, object]) -> TrainflowConfig:
    """A validated copy of cfg with dotted keys set (ConfigError if the result breaks a rule)."""
    out = copy.deepcopy(cfg)
    for key, value in overrides.items():
        *path, name = key.split(".")
        node = out
        for part in path:
            node = getattr(node, part)
        setattr(node, name, value)
    validate(out)
    return out


@dataclass(frozen=True)
class Remedy(Record):
    name: str
    overrides: str
    """The change, as config overrides (or what it assumes, for FP8)."""
    refused: str | None = None
    """Why the layout rules refuse the change (then no plan of it)."""
    step: StepPlan | None = None
    memory_bytes: int | None = None
    fits: bool | None = None


def remedies(cfg: TrainflowConfig, setup: PlanSetup) -> list[Remedy]:
    """Each remedy's step, throughput and memory beside the plan's (setup: cfg's)."""
    rows = []
    for name, overrides, fp8 in changes(cfg, setup):
        label = " ".join(f"{k}={v}" for k, v in overrides.items())
        if fp8:
            label = f"{label} (cluster.hardware.fp8_speedup on the block linears)".lstrip()
        try:
            changed = apply(cfg, overrides)
        except ConfigError as err:
            rows.append(Remedy(name=name, overrides=label, refused=str(err)))
            continue
        core = plan_core(changed, fp8=fp8)
        rows.append(Remedy(name, label, step=core.step, memory_bytes=core.memory.total, fits=core.overflow is None))
    return rows
