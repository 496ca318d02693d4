"""The planner under context parallel: a rank's activations are its share of the sequence, each layer's K/V
all-gather is a term of the step, and the 128k-token experiment plans to a layout that fits."""

from __future__ import annotations

import pytest

from trainflow.config import ParallelDims, compose
from trainflow.plan.build import build_plan
from trainflow.plan.collectives import mesh_groups
from trainflow.plan.memory import device_memory
from trainflow.plan.setup import model_counts
from trainflow.plan.table import render

LONG = "experiment=llama70b_alps_128k"


def activations(cp: int, seq: int) -> int:
    m = compose("train_segment", ["model=tiny", f"model.seq_len={seq}"]).model
    dims = ParallelDims(dp=1, tp=1, pp=1, cp=cp, world_size=cp)
    return device_memory(
        m, dims, counts=model_counts(m, dims), microbatch_size=2, precision="fp32", activations="keep", device="cpu"
    ).activations


def test_a_cp_rank_holds_its_share_of_the_activations_and_the_whole_sequences_keys():
    """cp2 halves the tokens a rank holds; the gathered K and V (and the mask) are what it keeps beyond half."""
    one, two = activations(1, 1024), activations(2, 1024)
    assert 0.5 < two / one < 0.6  # benchmarks/cp_memory.py measured 0.505 at seq 1024


def test_the_cp_group_lies_tp_apart_and_dp_spans_dp_x_cp():
    hw = compose("train_segment", [LONG]).cluster.hardware
    groups = mesh_groups(hw, ParallelDims(dp=4, cp=16, tp=8, pp=8, world_size=4096), ranks_per_node=4)
    assert groups.cp.size == 16 and groups.dp.size == 64 and groups.tp.size == 8
    assert groups.cp.link.gbps == min(hw.intra_node_gbps, hw.inter_node_gbps)  # one rank of a group per node


@pytest.fixture(scope="module")
def long_plan():
    return build_plan(compose("train_segment", [LONG]))


def test_the_long_context_experiment_fits_with_the_all_gather_in_its_step(long_plan):
    assert long_plan.overflow is None
    assert long_plan.setup.layout.cp == 16 and long_plan.setup.layout.world_size == 4096
    assert 0.05 < long_plan.step.split.shares()["cp"] < 0.1  # 7.6 % planned: 1.28 s of a 16.9 s step
    assert long_plan.memory.total < long_plan.capacity_bytes


def test_the_plan_prints_the_cp_share(long_plan):
    """What `python -m trainflow.plan experiment=llama70b_alps_128k` prints (plan.__main__ renders the plan)."""
    out = render(long_plan)
    assert "dp4 x cp16 x tp8 x pp8" in out
    (row,) = [line for line in out.splitlines() if "cp K/V all-gather in blocks" in line]
    assert row.split()[-1] == f"{long_plan.step.split.shares()['cp']:.1%}"


def test_without_cp_the_long_context_plan_overflows_and_names_cp():
    overrides = [LONG, "parallel.cp=1", "parallel.dp=64", "train.global_batch=1024"]
    plan = build_plan(compose("train_segment", overrides))
    assert plan.overflow is not None and "raise parallel.cp(1)" in plan.overflow


@pytest.mark.parametrize("cp", [1, 2])
def test_a_step_of_the_same_tokens_counts_the_all_gather_only_under_cp(cp):
    plan = build_plan(compose("train_segment", ["model=tiny", f"parallel.cp={cp}", "parallel.dp=1"]))
    assert (plan.step.split.cp > 0) == (cp > 1)
