"""The campaign around the step: checkpoint write time and Young/Daly interval, wall time, energy, tokens per joule.

    python -c "from trainflow.config import compose; from trainflow.plan.campaign import plan_campaign; \
        print(plan_campaign(compose('train_segment', ['experiment=llama70b_alps']), step_s=3.53))"

A checkpoint holds what trainflow.checkpoint.state saves: fp32 weights and AdamW's two fp32 moments,
12 bytes per parameter; it is written at cluster.hardware.storage_write_gbps (aggregate, all ranks together).
The interval is checkpoint.interval's Young/Daly formula on that predicted write time, capped as the
trainer caps it (checkpoint.max_interval_steps); `waste` is Young's first-order share of the campaign
lost to saving and to redoing work after a failure, save / interval + interval / (2 MTBF).

Energy is the seed's own estimate, devices x watts x time x PUE (trainflow.energy.accounting's
campaign_gwh): energy.gpu_watts per GPU, or energy.cpu_watts_per_core x cluster.allocation.cpus_per_task per CPU
rank. The energy stage measures what a run really drew; this is the plan's figure before it.
"""

from __future__ import annotations

from dataclasses import dataclass

from trainflow.checkpoint.interval import young_daly_steps
from trainflow.config.schema import TrainflowConfig
from trainflow.config.shape import total_params
from trainflow.energy.accounting import campaign_gwh
from trainflow.records import Record

CHECKPOINT_BYTES_PER_PARAM = 12
"""fp32 weights and AdamW's two fp32 moments."""


@dataclass(frozen=True)
class CampaignPlan(Record):
    parameters: int
    checkpoint_bytes: int
    save_s: float
    interval_s: float
    interval_steps: int
    waste: float
    steps: int
    tokens: int
    hours: float
    """Training steps plus the checkpoint saves between them."""
    watts_per_device: float
    facility_gwh: float
    tokens_per_joule: float


def plan_campaign(cfg: TrainflowConfig, *, step_s: float) -> CampaignPlan:
    """The campaign of train.total_steps steps of step_s seconds each."""
    c, t = cfg.cluster, cfg.train
    n = total_params(cfg.model)
    checkpoint_bytes = CHECKPOINT_BYTES_PER_PARAM * n
    save_s = checkpoint_bytes / (c.hardware.storage_write_gbps * 1e9)
    mtbf_s = c.hardware.mtbf_hours * 3600
    interval_steps = min(
        cfg.checkpoint.max_interval_steps, young_daly_steps(save_s=save_s, mtbf_s=mtbf_s, step_s=step_s)
    )
    if cfg.checkpoint.interval_steps:
        interval_steps = cfg.checkpoint.interval_steps
    interval_s = interval_steps * step_s
    steps = t.total_steps
    seconds = steps * step_s + steps // interval_steps * save_s
    world = cfg.parallel.world_size
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
        steps=steps,
        tokens=tokens,
        hours=seconds / 3600,
        watts_per_device=watts,
        facility_gwh=gwh,
        tokens_per_joule=tokens / (gwh * 3.6e12),
    )
