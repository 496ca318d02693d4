"""The campaign around the step: checkpoint write time and Young/Daly interval in both checkpoint modes, wall time,
energy, tokens per joule.

    python -c "from trainflow.config import compose; from trainflow.plan.campaign import plan_campaign; \
        cfg = compose('train_segment', ['experiment=llama70b_alps']); \
        from trainflow.plan.core import plan_core; core = plan_core(cfg); \
        print(plan_campaign(cfg, core.setup, step_s=3.53, memory=core.memory))"

A checkpoint holds what trainflow.checkpoint.state saves: fp32 weights and AdamW's two fp32 moments,
12 bytes per parameter; it is written at cluster.hardware.storage_write_gbps (aggregate, all ranks together).
The interval is checkpoint.interval's Young/Daly formula on the time training is blocked, capped as the
trainer caps it (checkpoint.max_interval_steps); `waste` is Young's first-order share of the campaign
lost to saving and to redoing work after a failure: blocked / interval + (interval / 2 + not yet durable) / MTBF.
- sync (`save_s`, `interval_*`, `waste`): training is blocked for the whole write, and a save is durable when
  it returns: save / interval + interval / (2 MTBF).
- async (`asynchronous`): training is blocked for the staging copy of the fullest rank's state (its fp32 weights
  and moments, plan.memory) into host memory at cluster.hardware.host_copy_gbps; the write runs behind it, so a
  checkpoint is durable `background_s` after it was taken, which a failure also loses, and the interval is never
  shorter than that write (one save in flight). The step slowdown while the write runs is not modelled (the report
  measures it per save). It needs one extra copy of every rank's state in host memory: a node's ranks' copies (and
  on a CPU device their training memory too) against cluster.allocation.mem_gb, or async is `refused` in one line,
  as the trainer's start-up check refuses it.
The campaign's hours and energy are those of checkpoint.mode (sync where async is refused).

Under resilience.recovery=peers only the hangs (cluster.hardware.hang_share of the failures) go the job path and lose
the work since the newest checkpoint; the others lose half a step (plan.peers). So Young/Daly's MTBF there is the job
path's, mtbf_hours / hang_share (checkpoint.interval.file_system_mtbf_s, which the trainer's IntervalPlanner takes
too); where hang_share is 0 no failure needs the file system and the interval reaches checkpoint.max_interval_steps.
A fixed checkpoint.interval_steps stays as configured; `waste` counts the redone work at the same MTBF.

Energy is the seed's own estimate, devices x watts x time x PUE (trainflow.energy.accounting's
campaign_gwh): energy.gpu_watts per GPU, or energy.cpu_watts_per_core x cluster.allocation.cpus_per_task per CPU
rank. The energy stage measures what a run really drew; this is the plan's figure before it.
"""

from __future__ import annotations

from dataclasses import dataclass

from trainflow.checkpoint.interval import async_interval_steps, file_system_mtbf_s, young_daly_steps
from trainflow.config.schema import TrainflowConfig
from trainflow.energy.accounting import campaign_gwh
from trainflow.plan.memory import MemoryEstimate
from trainflow.plan.setup import PlanSetup
from trainflow.records import Record

CHECKPOINT_BYTES_PER_PARAM = 12
"""fp32 weights and AdamW's two fp32 moments."""
GB = 1e9


@dataclass(frozen=True)
class AsyncCheckpoint(Record):
    """checkpoint.mode=async for the same campaign."""

    staging_bytes: int
    """The fullest rank's state, copied into host memory at every save."""
    blocking_s: float
    """That copy at cluster.hardware.host_copy_gbps: what training is blocked for."""
    background_s: float
    """The write behind it (the synchronous save's time): how long a checkpoint takes to become durable."""
    interval_s: float
    interval_steps: int
    waste: float
    host_bytes_per_node: float
    """A node's ranks' staging copies (on a CPU device their training memory too)."""
    host_capacity_bytes: float
    """cluster.allocation.mem_gb."""
    refused: str | None
    """The one line that refuses async when the node's host memory cannot hold the copies; None when it fits."""


@dataclass(frozen=True)
class CampaignPlan(Record):
    parameters: int
    checkpoint_bytes: int
    save_s: float
    """The checkpoint's write: a synchronous save's blocking time, an asynchronous one's background time."""
    interval_s: float
    """Synchronous saves' Young/Daly interval at file_system_mtbf_s (or checkpoint.interval_steps)."""
    interval_steps: int
    waste: float
    """Synchronous saves' share of the campaign lost to saving and redone work."""
    mode: str
    """checkpoint.mode: which of the two the hours and energy below assume."""
    asynchronous: AsyncCheckpoint
    steps: int
    tokens: int
    hours: float
    """Training steps plus the time the checkpoint saves between them block training."""
    watts_per_device: float
    facility_gwh: float
    tokens_per_joule: float
    job_interval_steps: int = 0
    """Synchronous saves' interval where every failure takes the job path (MTBF mtbf_hours): interval_steps under
    resilience.recovery=job; under peers, what a scenario without recovery from peers saves at (plan.scenarios)."""


def plan_async(
    cfg: TrainflowConfig, setup: PlanSetup, *, step_s: float, write_s: float, memory: MemoryEstimate
) -> AsyncCheckpoint:
    """The async mode's blocking copy, interval, waste and host-memory fit for a write of `write_s` seconds."""
    c, mtbf_s, most = cfg.cluster, file_system_mtbf_s(cfg), cfg.checkpoint.max_interval_steps
    staging = memory.parameters + memory.optimizer_state
    blocking_s = staging / (c.hardware.host_copy_gbps * GB)
    steps = async_interval_steps(blocking_s=blocking_s, background_s=write_s, mtbf_s=mtbf_s, step_s=step_s)
    steps = cfg.checkpoint.interval_steps or min(most, steps)
    interval_s = steps * step_s
    ranks = setup.ranks_per_node
    per_node = ranks * (staging + (memory.total if c.runtime.device == "cpu" else 0))
    capacity = c.allocation.mem_gb * GB
    refused = None
    if per_node > capacity:
        refused = (
            f"checkpoint.mode=async does not fit: {ranks} ranks per node stage {staging / GB:.3g} GB each"
            f"{' beside their training memory' if c.runtime.device == 'cpu' else ''}, {per_node / GB:.3g} GB of "
            f"{capacity / GB:.3g} GB (cluster.allocation.mem_gb); set checkpoint.mode=sync or give the job more host "
            "memory"
        )
    return AsyncCheckpoint(
        staging_bytes=staging,
        blocking_s=blocking_s,
        background_s=write_s,
        interval_s=interval_s,
        interval_steps=steps,
        waste=blocking_s / interval_s + (interval_s / 2 + write_s) / mtbf_s,
        host_bytes_per_node=per_node,
        host_capacity_bytes=capacity,
        refused=refused,
    )


def plan_campaign(cfg: TrainflowConfig, setup: PlanSetup, *, step_s: float, memory: MemoryEstimate) -> CampaignPlan:
    """The campaign of train.total_steps steps of step_s seconds each; memory is the step's (plan.fit)."""
    c, t = cfg.cluster, cfg.train
    n = setup.counts.total_params
    checkpoint_bytes = CHECKPOINT_BYTES_PER_PARAM * n
    save_s = checkpoint_bytes / (c.hardware.storage_write_gbps * GB)
    asynchronous = plan_async(cfg, setup, step_s=step_s, write_s=save_s, memory=memory)
    mtbf_s, most = file_system_mtbf_s(cfg), cfg.checkpoint.max_interval_steps
    interval_steps = min(most, young_daly_steps(save_s=save_s, mtbf_s=mtbf_s, step_s=step_s))
    job_interval_steps = min(most, young_daly_steps(save_s=save_s, mtbf_s=c.hardware.mtbf_hours * 3600, step_s=step_s))
    if cfg.checkpoint.interval_steps:
        interval_steps = job_interval_steps = cfg.checkpoint.interval_steps
    interval_s = interval_steps * step_s
    steps = t.total_steps
    if cfg.checkpoint.mode == "async" and asynchronous.refused is None:
        seconds = steps * step_s + steps // asynchronous.interval_steps * asynchronous.blocking_s
    else:
        seconds = steps * step_s + steps // interval_steps * save_s
    world = setup.layout.world_size
    watts = (
        cfg.energy.gpu_watts
        if c.runtime.device == "cuda"
        else cfg.energy.cpu_watts_per_core * c.allocation.cpus_per_task
    )
    gwh = campaign_gwh(gpus=world, watts=watts, hours=seconds / 3600, pue=cfg.energy.pue)
    tokens = steps * t.global_batch * cfg.model.seq_len
    return CampaignPlan(
        parameters=n,
        checkpoint_bytes=checkpoint_bytes,
        save_s=save_s,
        interval_s=interval_s,
        interval_steps=interval_steps,
        waste=save_s / interval_s + interval_s / (2 * mtbf_s),
        mode=cfg.checkpoint.mode,
        asynchronous=asynchronous,
        steps=steps,
        tokens=tokens,
        hours=seconds / 3600,
        watts_per_device=watts,
        facility_gwh=gwh,
        tokens_per_joule=tokens / (gwh * 3.6e12),
        job_interval_steps=job_interval_steps,
    )
