"""The planner's checkpoint modes for the seed's campaign: async blocks for the staging copy only, is durable a
write later, plans Young/Daly on the copy but no shorter than the write, and is refused where host memory is short."""

from __future__ import annotations

import math

import pytest

from trainflow.config import compose
from trainflow.plan.campaign import plan_campaign as campaign_of
from trainflow.plan.memory import plan_memory
from trainflow.plan.setup import plan_setup

SEED = ("experiment=llama70b_alps",)


def plan_campaign(cfg, *, step_s):
    setup = plan_setup(cfg)
    return campaign_of(cfg, setup, step_s=step_s, memory=plan_memory(cfg, setup))


def test_async_waste_of_the_seed_campaign_is_a_tenth_of_sync():
    cfg = compose("train_segment", [*SEED, "checkpoint.interval_steps=0"])  # Young/Daly's, not the experiment's 20
    plan, h = plan_campaign(cfg, step_s=10.0), cfg.cluster.hardware
    a, memory, mtbf_s = plan.asynchronous, plan_memory(cfg, plan_setup(cfg)), h.mtbf_hours * 3600
    assert plan.mode == "async" and a.refused is None
    assert a.staging_bytes == memory.parameters + memory.optimizer_state  # fp32 weights and moments of the rank
    assert a.blocking_s == pytest.approx(a.staging_bytes / (h.host_copy_gbps * 1e9))
    assert a.background_s == plan.save_s  # the same write, behind training
    assert a.interval_steps == math.ceil(plan.save_s / 10.0)  # Young/Daly on 0.06 s is shorter than the write
    assert a.waste == pytest.approx(a.blocking_s / a.interval_s + (a.interval_s / 2 + plan.save_s) / mtbf_s)
    assert a.waste < 0.02 < 0.12 < plan.waste  # the seed's plan: 13 % of the campaign in sync mode
    assert plan.hours == pytest.approx(plan.steps * 10.0 / 3600 + plan.steps // a.interval_steps * a.blocking_s / 3600)
    assert a.host_bytes_per_node == 4 * a.staging_bytes <= a.host_capacity_bytes  # 4 GH200 per node


def test_async_is_refused_where_a_node_cannot_hold_the_copies():
    cfg = compose("train_segment", [*SEED, "cluster.allocation.mem_gb=48"])
    refused = plan_campaign(cfg, step_s=10.0).asynchronous.refused
    assert refused == (
        "checkpoint.mode=async does not fit: 4 ranks per node stage 14.4 GB each, 57.7 GB of 48 GB "
        "(cluster.allocation.mem_gb); set checkpoint.mode=sync or give the job more host memory"
    )
    sync = plan_campaign(compose("train_segment", [*SEED, "checkpoint.mode=sync"]), step_s=10.0)
    assert plan_campaign(cfg, step_s=10.0).hours == sync.hours  # a refused async plan falls back to sync's hours
