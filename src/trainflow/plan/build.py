"""The whole plan of a composed config, one record: what `python -m trainflow.plan` prints (as a table, or with
--json as the record's JSON) and validate_nccl records in nccl.json.

    python -c "from trainflow.config import compose; from trainflow.plan.build import build_plan; \
        print(build_plan(compose('train_segment', ['experiment=smoke'])).step)"
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field

from trainflow.config.layout import ParallelDims
from trainflow.config.schema import TrainflowConfig
from trainflow.plan.campaign import CampaignPlan, plan_campaign
from trainflow.plan.fit import capacity_bytes, overflow, plan_memory
from trainflow.plan.goodput import GoodputPlan, plan_goodput
from trainflow.plan.memory import MemoryEstimate, checked_layout
from trainflow.plan.remedies import Remedy, remedies
from trainflow.plan.seed import SeedComparison, is_seed_layout, seed_comparison
from trainflow.plan.step import StepPlan, plan_step
from trainflow.records import Record


@dataclass(frozen=True)
class Setup(Record):
    """What the plan is of: the model, the layout, the batch and how a step computes, on which cluster preset."""

    model: str
    layout: ParallelDims
    microbatch_size: int
    """Sequences per microbatch: train.global_batch / (dp x microbatches)."""
    global_batch: int
    seq_len: int
    precision: str
    activations: str
    cluster: str


@dataclass(frozen=True)
class Plan(Record):
    setup: Setup
    hardware: dict[str, float | str]
    """cluster.hardware as the plan assumed it (each preset in conf/cluster/ gives every value's source)."""
    memory: MemoryEstimate
    """The fullest pipeline rank's bytes at the peak of a step, by term."""
    capacity_bytes: float
    """What one rank may hold (plan.fit)."""
    overflow: str | None
    """The one line that stops validate_nccl when the plan does not fit; None when it fits."""
    step: StepPlan
    campaign: CampaignPlan
    goodput: GoodputPlan | None
    """Goodput under failures with synchronous checkpoints and with each remedy, and the goal; None where the plan
    does not fit (nothing is simulated for a run that cannot start)."""
    remedies: list[Remedy] = field(default_factory=list)
    seed: SeedComparison | None = None
    """The seed's observed figures beside the plan's, for the seed's layout only."""


def build_plan(cfg: TrainflowConfig, *, with_remedies: bool = True) -> Plan:
    """Memory, step split, throughput, checkpoint interval, campaign energy and goodput of cfg; the fit first, and no
    goodput where it fails."""
    t = cfg.train
    dims, microbatch_size = checked_layout(cfg)
    memory = plan_memory(cfg)
    overflows = overflow(cfg, memory)
    step = plan_step(cfg)
    setup = Setup(
        model=cfg.model.name,
        layout=dims,
        microbatch_size=microbatch_size,
        global_batch=t.global_batch,
        seq_len=cfg.model.seq_len,
        precision=t.precision,
        activations=t.activations,
        cluster=cfg.cluster.name,
    )
    campaign = plan_campaign(cfg, step_s=step.step_s)
    replicas = dims.dp // dims.shard_size
    return Plan(
        setup=setup,
        hardware=asdict(cfg.cluster.hardware),
        memory=memory,
        capacity_bytes=capacity_bytes(cfg.cluster, cfg.parallel.world_size),
        overflow=overflows,
        step=step,
        campaign=campaign,
        goodput=None if overflows else plan_goodput(cfg, step_s=step.step_s, campaign=campaign, replicas=replicas),
        remedies=remedies(cfg) if with_remedies else [],
        seed=seed_comparison(cfg, step) if is_seed_layout(cfg) else None,
    )
