"""The whole plan of a composed config, one record: what `python -m trainflow.plan` prints (as a table, or with
--json as the record's JSON) and validate_nccl records in nccl.json.

    python -c "from trainflow.config import compose; from trainflow.plan.build import build_plan; \
        print(build_plan(compose('train_segment', ['experiment=smoke'])).step)"
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field

from trainflow.config.cluster import HardwareConfig
from trainflow.config.schema import TrainflowConfig
from trainflow.plan.campaign import CampaignPlan, plan_campaign
from trainflow.plan.core import plan_core
from trainflow.plan.goodput import GoodputPlan, plan_goodput
from trainflow.plan.memory import MemoryEstimate
from trainflow.plan.remedies import Remedy, remedies
from trainflow.plan.seed import SeedComparison, is_seed_layout, seed_comparison
from trainflow.plan.setup import PlanSetup
from trainflow.plan.startup import StartupPlan, plan_startup
from trainflow.plan.step import StepPlan
from trainflow.preflight import local_world_errors
from trainflow.records import Record


@dataclass(frozen=True)
class Plan(Record):
    setup: PlanSetup
    hardware: dict[str, float | str]
    """cluster.hardware as the plan assumed it (each preset in conf/cluster/ gives every value's source), startup_s
    and hot_restart_s as `startup` resolves them."""
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
    startup: StartupPlan | None = None
    """The start-up's parts at the campaign's world size, and startup_s and hot_restart_s (None: a plan written before
    the start-up had parts)."""


def build_plan(cfg: TrainflowConfig, *, with_remedies: bool = True) -> Plan:
    """Memory, step split, throughput, checkpoint interval, campaign energy and goodput of cfg; the fit first, and no
    goodput where it fails."""
    core = plan_core(cfg)
    setup, step = core.setup, core.step
    campaign = plan_campaign(cfg, setup, step_s=step.step_s, memory=core.memory)
    startup = plan_startup(
        cfg.cluster.hardware, cfg.cluster.measured, world=setup.layout.world_size, step_s=step.step_s
    )
    goodput = None
    if not core.overflow:
        goodput = plan_goodput(cfg, setup, step_s=step.step_s, campaign=campaign, startup=startup)
    rows = remedies(cfg, setup) if with_remedies else []
    seed = None
    if is_seed_layout(cfg):
        seed = seed_comparison(cfg, setup, step)
    return Plan(
        setup=setup,
        hardware=assumed(cfg.cluster.hardware, startup),
        memory=core.memory,
        capacity_bytes=core.capacity_bytes,
        overflow=core.overflow,
        step=step,
        campaign=campaign,
        goodput=goodput,
        remedies=rows,
        seed=seed,
        startup=startup,
    )


def assumed(h: HardwareConfig, startup: StartupPlan) -> dict[str, float | str]:
    """cluster.hardware's values as the plan took them: startup_s and hot_restart_s resolved, the parts' laws in
    `startup`."""
    values = {k: v for k, v in asdict(h).items() if k != "startup"}
    return values | {"startup_s": startup.startup_s, "hot_restart_s": startup.hot_restart_s}


def refusal(cfg: TrainflowConfig, plan: Plan) -> str | None:
    """The one line that stops cfg's run as planned: a local world this machine cannot hold (the plan counts tensors;
    a local world's processes need this machine too), a plan that does not fit, a campaign that cannot finish; None
    when it can run."""
    local = local_world_errors(cfg)
    return (local[0] if local else None) or plan.overflow or (plan.goodput and plan.goodput.cannot_finish) or None
