"""The whole plan of a composed config as one JSON-ready dict: what `python -m trainflow.plan` prints and
validate_nccl records.

    python -c "from trainflow.config import compose; from trainflow.plan.build import build_plan; \
        print(build_plan(compose('train_segment', ['experiment=smoke']))['step'])"
"""

from __future__ import annotations

from dataclasses import asdict

from trainflow.config.schema import TrainflowConfig
from trainflow.plan.campaign import plan_campaign
from trainflow.plan.fit import capacity_bytes, overflow, plan_memory
from trainflow.plan.remedies import remedies
from trainflow.plan.seed import is_seed_layout, seed_comparison
from trainflow.plan.step import plan_step


def build_plan(cfg: TrainflowConfig, *, with_remedies: bool = True) -> dict:
    """Memory, step split, throughput, checkpoint interval and campaign energy of cfg."""
    p, t, c = cfg.parallel, cfg.train, cfg.cluster
    memory = plan_memory(cfg)
    step = plan_step(cfg)
    campaign = plan_campaign(cfg, step_s=step.step_s)
    plan = {
        "config": {
            "model": cfg.model.name,
            "layout": f"dp{p.dp} x tp{p.tp} x pp{p.pp}",
            "schedule": p.schedule if p.pp > 1 else None,
            "virtual_stages": p.virtual_stages,
            "microbatches": p.microbatches,
            "micro_batch": t.global_batch // (p.dp * p.microbatches),
            "global_batch": t.global_batch,
            "seq_len": cfg.model.seq_len,
            "dp_mode": p.dp_mode,
            "precision": t.precision,
            "activations": t.activations,
            "cluster": c.name,
            "devices": p.world_size,
        },
        "assumptions": asdict(c.hardware),  # each preset in conf/cluster/ gives every value's source
        "parameters": campaign.parameters,
        "memory": {
            **asdict(memory),
            "total": memory.total,
            "capacity": capacity_bytes(c, p.world_size),
            "overflow": overflow(cfg, memory),
        },
        "step": {
            "seconds": asdict(step.split),
            "shares": step.split.shares(),
            "step_s": step.step_s,
            "tokens_per_s_per_device": step.tokens_per_s_per_device,
            "mfu": step.mfu,
            "model_flops_per_token": step.model_flops_per_token,
            "bubble_fraction": step.bubble_fraction,
            "dp_all_reduce_s": step.dp_seconds,
            "per_pp_rank": [asdict(s) for s in step.per_pp_rank],
        },
        "checkpoint": {
            "bytes": campaign.checkpoint_bytes,
            "save_s": campaign.save_s,
            "young_daly_s": campaign.interval_s,
            "interval_steps": campaign.interval_steps,
            "waste": campaign.waste,
        },
        "campaign": {
            "steps": campaign.steps,
            "tokens": campaign.tokens,
            "hours": campaign.hours,
            "watts_per_device": campaign.watts_per_device,
            "facility_gwh": campaign.facility_gwh,
            "tokens_per_joule": campaign.tokens_per_joule,
        },
    }
    if with_remedies:
        plan["remedies"] = remedies(cfg)
    if is_seed_layout(cfg):
        plan["seed"] = seed_comparison(cfg, step)
    return plan
