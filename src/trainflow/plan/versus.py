"""The plan beside a measured run: each part of the trainer's step split against the plan's parts it holds.

    rows = side_by_side(plan.step.per_pp_rank[0], measured_split(summary.steps), layout=summary.layout)

The trainer groups a step's time differently from the plan (trainflow.parallel.timing.StepTimes): its
compute is the timed forward/backward, which holds the tp all-reduces and, on a pure-dp mesh, the dp
all-reduce too (torch's DDP waits for its buckets inside backward); its dp_comm_s is GradReducer's or
FSDP's wait after backward; its step_s holds data loading, which the plan does not model, and the
optimizer step, which it does.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict
from statistics import median

from trainflow.config.layout import ParallelDims
from trainflow.plan.step import StepSplit

MEASURED = ("step_s", "data_s", "compute_s", "dp_comm_s", "bubble_s", "activation_s")
"""The fields of a step record (trainflow.train.step_log.StepRecord) the comparison reads."""


def measured_split(steps: Sequence[object]) -> dict[str, float]:
    """The median of each part over a segment's step records, the first (warm-up) left out when there are more."""
    steady = steps[1:] or steps
    return {key: median(getattr(r, key) for r in steady) for key in MEASURED}


def plan_parts(layout: ParallelDims) -> dict[str, list[str]]:
    """Which of the plan's parts each measured part holds, for a segment's layout."""
    pipelined = layout.pp_enabled
    ddp = not pipelined and layout.tp == 1 and layout.dp > 1 and not layout.fsdp_enabled
    return {
        "compute_s": ["compute", "tp"] + (["dp"] if ddp else []),
        "dp_comm_s": [] if ddp else ["dp"],
        "bubble_s": ["bubble"] if pipelined else [],
        "activation_s": ["activation"] if pipelined else [],
    }


def side_by_side(planned: StepSplit, measured: dict[str, float], *, layout: ParallelDims) -> dict[str, dict]:
    """Per measured part: the plan's parts it holds, their predicted seconds, the measured seconds; and the
    whole step (measured less data loading, which the plan leaves out) with predicted / measured."""
    parts = asdict(planned)
    rows = {
        key: {"plan_parts": names, "predicted": sum(parts[p] for p in names), "measured": measured[key]}
        for key, names in plan_parts(layout).items()
    }
    step = measured["step_s"] - measured["data_s"]
    rows["step_s_less_data"] = {"plan_parts": sorted(parts), "predicted": planned.total, "measured": step}
    for row in rows.values():
        row["ratio"] = row["predicted"] / row["measured"] if row["measured"] > 0 else None
    return rows
