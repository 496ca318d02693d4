"""trainflow.plan: the step model's arithmetic on hand-computed cases, the seed's campaign within stated bands,
the overflow line that stops validate_nccl before any launch, and the command line's JSON."""

from __future__ import annotations

import dataclasses
import functools
import json
import math
import subprocess
import sys

import pytest

from tests.support import marks
from trainflow.config import AllocationConfig, ClusterConfig, HardwareConfig, ParallelDims, compose
from trainflow.plan.build import Plan, build_plan
from trainflow.plan.campaign import plan_campaign
from trainflow.plan.collectives import (
    Link,
    allreduce_bytes,
    allreduce_seconds,
    bucketed_allreduce_seconds,
    group_link,
)
from trainflow.plan.core import plan_core
from trainflow.plan.fit import capacity_bytes
from trainflow.plan.memory import device_memory, plan_memory
from trainflow.plan.setup import layout_setup, model_counts, plan_setup
from trainflow.plan.step import StepSplit, step_plan
from trainflow.plan.step_comms import ENDS_BACKWARD, ENDS_FORWARD, TP_BACKWARD, TP_FORWARD
from trainflow.plan.versus import measured_split, side_by_side
from trainflow.stage import StageError
from trainflow.stages import validate_nccl

SEED = ("experiment=llama70b_alps",)  # bf16, activations recomputed: the campaign as configured
ALPS = ClusterConfig(
    allocation=AllocationConfig(nodes=1024),
    hardware=HardwareConfig(
        peak_tflops=989.0,
        matmul_efficiency=0.7,
        fp8_speedup=2.0,
        memory_gbps=4000.0,
        allreduce_algorithm="ring",
        overlap_fraction=0.8,
        intra_node_gbps=150.0,
        intra_node_latency_us=3.0,
        inter_node_gbps=25.0,
        inter_node_latency_us=10.0,
    ),
)


@functools.cache
def config(*overrides: str):
    return compose("train_segment", list(overrides))


def test_ring_and_tree_all_reduce_bytes_and_times():
    link = Link(gbps=10.0, latency_us=5.0)
    assert allreduce_bytes(1e9, 4, "ring") == 1.5e9  # 2 (n-1)/n S
    assert allreduce_bytes(1e9, 4, "tree") == 2e9  # S up, S down
    assert allreduce_bytes(1e9, 1, "ring") == 0.0
    assert allreduce_seconds(1e9, 4, link, "ring") == pytest.approx(6 * 5e-6 + 0.15)
    assert allreduce_seconds(1e9, 64, link, "tree") == pytest.approx(2 * 6 * 5e-6 + 0.2)
    # 2.5 buckets of 0.4 GB: two full ones and a half one, each paying its own latency.
    assert bucketed_allreduce_seconds(1e9, 4, link, "ring", bucket_bytes=0.4e9) == pytest.approx(3 * 6 * 5e-6 + 0.15)


def test_a_groups_link_is_its_slowest_level():
    def link(size, stride):
        return group_link(ALPS.hardware, size=size, stride=stride, ranks_per_node=4)

    assert link(4, 1) == Link(150.0, 3.0)  # tp4 inside a node: NVLink
    assert link(8, 1) == Link(100.0, 10.0)  # tp8 over two nodes: 4 NICs of 25 GB/s
    assert link(64, 8) == Link(25.0, 10.0)  # dp: one rank per node, one NIC
    assert link(8, 512) == Link(25.0, 10.0)  # pp neighbours


def grid(schedule: str, v: int, m: int = 4, pp: int = 4) -> ParallelDims:
    return ParallelDims(dp=1, tp=1, pp=pp, world_size=pp, virtual_stages=v, schedule=schedule, microbatches=m)


@pytest.mark.parametrize(
    ("schedule", "v", "want"), [("gpipe", 1, 3 / 7), ("1f1b", 1, 3 / 7), ("interleaved_1f1b", 2, 3 / 11)]
)
def test_bubble_per_schedule(schedule, v, want):
    m = config("model=llama3_8b").model
    setup = layout_setup(m, grid(schedule, v), ALPS, global_batch=4, precision="bf16", activations="keep")
    plan = step_plan(m, setup, ALPS, bucket_mb=25, overlap=True)
    assert plan.bubble_fraction == pytest.approx(want)
    busiest = plan.split  # the last rank: it holds the output head
    per_microbatch = (busiest.compute + busiest.tp) / 4
    assert busiest.bubble == pytest.approx(3 / v * per_microbatch)  # (p-1)/v microbatch slots idle
    assert busiest.bubble / (busiest.total - busiest.activation - busiest.dp - busiest.optimizer) == pytest.approx(want)
    lighter = plan.per_pp_rank[0]  # idles also while the last rank finishes its heavier microbatches
    assert lighter.bubble > busiest.bubble


def test_tp_all_reduces_per_block_are_what_torch_runs():
    """TP_FORWARD / TP_BACKWARD and ENDS_FORWARD / ENDS_BACKWARD against the collectives torch's DTensor issues for a
    tp2 model (its blocks and its vocab-parallel embedding and head)."""
    import torch
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor.debug import CommDebugMode
    from torch.testing._internal.distributed.fake_pg import FakeStore

    from trainflow.model import Llama, cross_entropy
    from trainflow.parallel.tensor_parallel import apply_tp

    m = config("model=tiny").model
    dist.init_process_group("fake", store=FakeStore(), rank=0, world_size=2)
    try:
        model = Llama(m)
        apply_tp(model, init_device_mesh("cpu", (2,)))
        x = torch.randint(0, m.vocab_size, (1, m.seq_len))
        with CommDebugMode() as forward:
            out = model(x)
        with CommDebugMode() as backward:
            cross_entropy(out, x).backward()
    finally:
        dist.destroy_process_group()
    assert forward.get_total_counts() == TP_FORWARD * m.n_layers + ENDS_FORWARD
    assert backward.get_total_counts() == TP_BACKWARD * m.n_layers + ENDS_BACKWARD


def test_the_vocab_parallel_ends_split_the_heads_matmul_and_cost_their_collectives_on_the_end_ranks():
    """tp2 x pp2, 2 microbatches of one sequence: the last rank's head multiplies half the vocabulary and gathers
    the logits and sums its input gradient; the first rank's embedding sums its output."""
    m = config("model=llama3_8b").model
    dims = ParallelDims(dp=1, tp=2, pp=2, world_size=4, schedule="1f1b", microbatches=2)
    setup = layout_setup(m, dims, ALPS, global_batch=2, precision="bf16", activations="keep")
    first, last = step_plan(m, setup, ALPS, bucket_mb=25, overlap=True).per_pp_rank
    tp, tokens, hw = setup.groups.tp, m.seq_len, ALPS.hardware
    embedding = tp.allreduce_s(tokens * m.dim * 4)  # the fp32 residual stream
    head = tp.shard_s(tokens * m.vocab_size * 2) + tp.allreduce_s(tokens * m.dim * 4)  # bf16 logits, fp32 gradient
    assert last.tp - first.tp == pytest.approx(2 * (head - embedding))
    head_flops = 3 * 2 * tokens * m.vocab_size // 2 * m.dim  # forward and backward on 64128 of 128256 rows
    assert last.compute - first.compute == pytest.approx(
        2 * head_flops / (hw.peak_tflops * 1e12 * hw.matmul_efficiency)
    )


def test_memory_capacity_and_shard_groups():
    cfg = config("parallel=dp2_tp2_pp2", "cluster=slurm_local")
    assert cfg.cluster.hardware.device_memory_gb == cfg.cluster.allocation.mem_gb  # a CPU's device memory is the host's
    assert plan_setup(cfg).ranks_per_node == 8
    assert capacity_bytes(cfg.cluster, 8) == cfg.cluster.allocation.mem_gb * 1e9 / 8  # CPU: a rank's share of the node
    assert (
        capacity_bytes(
            dataclasses.replace(cfg.cluster, runtime=dataclasses.replace(cfg.cluster.runtime, device="cuda")), 8
        )
        == cfg.cluster.hardware.device_memory_gb * 1e9
    )
    hsdp = ParallelDims(dp=4, tp=1, pp=1, world_size=4, dp_mode="shard", dp_shard=2)
    fp32_keep = {"microbatch_size": 1, "precision": "fp32", "activations": "keep"}
    fsdp, replicate = dataclasses.replace(hsdp, dp_shard=4), dataclasses.replace(hsdp, dp_mode="replicate", dp_shard=1)
    state = {
        name: device_memory(cfg.model, dims, counts=model_counts(cfg.model, dims), **fp32_keep).optimizer_state
        for name, dims in (("hsdp", hsdp), ("fsdp", fsdp), ("replicate", replicate))
    }
    assert state["hsdp"] == -(-state["replicate"] // 2) and state["fsdp"] == -(-state["replicate"] // 4)


def test_young_daly_interval_from_the_predicted_write():
    # The experiment saves asynchronously (test_checkpoint_plan.py) at a fixed interval; here sync at Young/Daly's.
    cfg = config(*SEED, "checkpoint.mode=sync", "checkpoint.interval_steps=0")
    plan = plan_campaign(cfg, plan_setup(cfg), step_s=10.0, memory=plan_memory(cfg, plan_setup(cfg)))
    save = 12 * 70_553_706_496 / (cfg.cluster.hardware.storage_write_gbps * 1e9)  # Llama 3 70B's published parameters
    assert plan.save_s == pytest.approx(save)
    want = math.sqrt(2 * save * cfg.cluster.hardware.mtbf_hours * 3600)
    assert plan.interval_steps == round(want / 10.0)
    hours = plan.steps * 10.0 / 3600 + plan.steps // plan.interval_steps * save / 3600
    assert plan.facility_gwh == pytest.approx(4096 * cfg.energy.gpu_watts * hours * cfg.energy.pue / 1e9)


def test_seed_campaign_within_stated_bands():
    """The seed's layout under the plan's physics: activation traffic near the seed's 15 %, the bubble the
    interleaved schedule's 7/87, and the figures that cannot hold with 580 tokens/s named (plan.seed)."""
    plan = build_plan(config(*SEED))
    shares = plan.step.split.shares()
    assert plan.overflow is None
    assert 0.10 <= shares["activation"] <= 0.20
    assert plan.step.bubble_fraction == pytest.approx(7 / 87)
    assert 0.30 <= shares["tp"] <= 0.60  # tp8 over two 4-GPU nodes
    assert 100 <= plan.step.tokens_per_s_per_device <= 300  # not the seed's 580: plan.seed says why
    assert "needs matmuls at 94% of peak_tflops" in plan.seed.notes[0]
    remedies = {r.name: r.step for r in plan.remedies}
    assert remedies["1F1B instead of interleaved"].split.shares()["bubble"] > 0.2
    assert remedies["tp inside a node (tp4)"].tokens_per_s_per_device > 1.5 * plan.step.tokens_per_s_per_device
    assert remedies["FP8 matmuls"].step_s < plan.step.step_s


def test_overflow_names_the_term_and_the_fix():
    def fit(cfg):
        return plan_core(cfg).overflow

    line = fit(config("experiment=llama70b_alps", "train.precision=fp32", "train.activations=keep"))
    assert line is not None and "\n" not in line
    assert "activations take" in line and "train.activations=recompute" in line and "of 96 GB" in line
    assert fit(config(*SEED)) is None
    assert fit(config("experiment=smoke")) is None


def test_an_overflowing_plan_stops_validate_nccl_before_any_launch(monkeypatch, tmp_path):
    def no_launch(*args, **kwargs):
        raise AssertionError("validate_nccl launched a job for a plan that does not fit")

    monkeypatch.setattr(validate_nccl, "build_executor", no_launch)
    cfg = compose("validate_nccl", ["experiment=smoke", f"storage.root={tmp_path}", "cluster.allocation.mem_gb=0.001"])
    with pytest.raises(StageError, match=r"stopped before launching: the plan does not fit.* of 0\.0005 GB"):
        validate_nccl.run(cfg)


def test_a_campaign_that_cannot_finish_stops_validate_nccl_before_any_launch(monkeypatch, tmp_path):
    def no_launch(*args, **kwargs):
        raise AssertionError("validate_nccl launched a job for a campaign that cannot finish")

    monkeypatch.setattr(validate_nccl, "build_executor", no_launch)
    mtbf = "cluster.hardware.mtbf_hours=0.001"  # 3.6 s: less than a restart takes
    cfg = compose("validate_nccl", ["experiment=smoke", f"storage.root={tmp_path}", mtbf])
    with pytest.raises(StageError, match=r"stopped before launching: .*MTBF") as err:
        validate_nccl.run(cfg)
    assert "\n" not in str(err.value)


def test_the_command_prints_the_plan_as_json():
    out = subprocess.run(
        [sys.executable, "-m", "trainflow.plan", "experiment=llama70b_alps", "--json"],
        capture_output=True,
        text=True,
        check=True,
    )
    plan = json.loads(out.stdout)
    assert plan["setup"]["layout"]["world_size"] == 4096 and plan["campaign"]["parameters"] == 70_553_706_496
    assert plan["overflow"] is None  # the experiment trains bf16 with recompute, which fits
    assert set(plan["step"]["split"]) == {"compute", "tp", "bubble", "activation", "dp", "optimizer", "cp"}
    assert Plan.from_json(plan) == build_plan(config(*SEED))  # the JSON reads back into the same record


def test_measured_parts_pair_with_the_plans_parts_they_hold():
    planned = StepSplit(compute=1.0, tp=0.5, bubble=0.25, activation=0.125, dp=0.0625, optimizer=0.03125)
    steps = marks(
        {"step_s": 9.0, "data_s": 1.0, "compute_s": 9.0, "dp_comm_s": 9.0, "bubble_s": 9.0, "activation_s": 9.0},
        *(
            {"step_s": s, "data_s": 0.1, "compute_s": 1.5, "dp_comm_s": 0.1, "bubble_s": 0.2, "activation_s": 0.1}
            for s in (2.0, 2.2, 2.1)
        ),
    )  # the first step (warm-up) is left out of the medians
    measured = measured_split(steps)
    assert measured["step_s"] == 2.1 and measured["compute_s"] == 1.5
    pipelined = side_by_side(planned, measured, layout=ParallelDims(dp=2, tp=2, pp=2, world_size=8))
    assert pipelined["compute_s"]["predicted"] == 1.5 and pipelined["dp_comm_s"]["predicted"] == 0.0625
    assert pipelined["step_s_less_data"]["ratio"] == pytest.approx(planned.total / 2.0)
    # A pure-dp mesh runs torch's DDP, which waits for the dp all-reduce inside backward: compute holds it.
    ddp = side_by_side(planned, measured, layout=ParallelDims(dp=2, tp=1, pp=1, world_size=2))
    assert ddp["compute_s"]["plan_parts"] == ["compute", "tp", "dp"] and ddp["dp_comm_s"]["predicted"] == 0
    assert ddp["bubble_s"]["predicted"] == 0 and ddp["bubble_s"]["ratio"] == 0


def test_the_headline_step_runs_fp8_where_training_does():
    bf16 = build_plan(compose("train_segment", ["experiment=llama70b_alps"]))
    fp8 = build_plan(compose("train_segment", ["experiment=llama70b_alps", "train.fp8=delayed"]))
    (remedy,) = [r for r in bf16.remedies if r.name == "FP8 matmuls"]
    assert fp8.step.tokens_per_s_per_device == pytest.approx(remedy.step.tokens_per_s_per_device)
    assert fp8.step.tokens_per_s_per_device > 1.05 * bf16.step.tokens_per_s_per_device
