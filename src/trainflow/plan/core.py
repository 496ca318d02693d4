"""The plan of one config's step, in the order every part needs it: the setup resolved once, the memory estimate,
whether it fits, the step split. build_plan makes it for the config and plan.remedies for each changed one.

    python -c "from trainflow.config import compose; from trainflow.plan.core import plan_core; \
        print(plan_core(compose('train_segment', ['experiment=llama70b_alps'])).step.step_s)"
"""

from __future__ import annotations

from dataclasses import dataclass

from trainflow.config.schema import TrainflowConfig
from trainflow.plan.fit import capacity_bytes, overflow
from trainflow.plan.memory import MemoryEstimate, plan_memory
from trainflow.plan.setup import PlanSetup, plan_setup
from trainflow.plan.step import StepPlan, plan_step


@dataclass(frozen=True)
class CorePlan:
    setup: PlanSetup
    memory: MemoryEstimate
    capacity_bytes: float
    """What one rank may hold (plan.fit)."""
    overflow: str | None
    """The one line saying the memory does not fit; None when it fits."""
    step: StepPlan


def plan_core(cfg: TrainflowConfig, *, fp8: bool = False) -> CorePlan:
    """cfg's setup, memory, fit and step (`fp8`: its block linears at cluster.hardware.fp8_speedup, plan_step)."""
    setup = plan_setup(cfg)
    memory = plan_memory(cfg, setup)
    capacity = capacity_bytes(cfg.cluster, setup.ranks_per_node)
    return CorePlan(
        setup=setup,
        memory=memory,
        capacity_bytes=capacity,
        overflow=overflow(cfg, memory, capacity),
        step=plan_step(cfg, setup, fp8=fp8),
    )
