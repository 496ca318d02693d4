"""The health check's verdict (launch.health_check): what its ranks found, crafted, against the gate's in-node
threshold; the matmul against the CPU's float64. The check as a real job: tests/slurm/test_probation_on_slurm.py."""

from __future__ import annotations

import pytest
import torch

from trainflow.config import compose
from trainflow.launch.health_check import MATMUL_TOLERANCE, RankHealth, matmul_error, verdict


@pytest.fixture(scope="module")
def tp2():
    return compose("train_segment", ["experiment=smoke", "parallel=tp2", "cluster.gate.busbw_gbps={tp_all_reduce:100}"])


def ranks(*, host: str = "n2", busbw: float | None = 150.0, error: float = 1e-7, fault: str = "") -> list[RankHealth]:
    return [RankHealth("n2", busbw and 160.0, 1e-7, ""), RankHealth(host, busbw, error, fault)]


@pytest.mark.parametrize(
    "found, passed, line",
    [
        (ranks(), True, "passed: 2 rank(s), matmul error <= 1e-07, in-node all_reduce 150 GB/s"),
        (ranks(busbw=None), True, "passed: 2 rank(s), matmul error <= 1e-07"),
        (ranks(busbw=40.0), False, "failed: in-node all_reduce at 40 GB/s, below the gate's tp_all_reduce 100"),
        (ranks(error=0.9), False, "failed: a matmul's relative error 0.9 > 0.001 against the CPU's"),
        (ranks(fault="NVML: GPU 1: retired pages pending"), False, "failed: NVML: GPU 1: retired pages pending"),
        (ranks(host="n7"), False, "ran on n2, n7, not n2"),
    ],
    ids=["passes", "one-rank-a-node", "slow-link", "corrupt-matmul", "nvml", "other-host"],
)
def test_the_check_passes_only_where_every_rank_found_nothing(tp2, found, passed, line):
    assert verdict(tp2, "n2", found) == (passed, line)


def test_a_threshold_for_groups_no_node_holds_is_not_the_checks(tp2):
    # tp4 over nodes of 2 ranks: the tp groups cross nodes, so the in-node sweep is reported, never held to it.
    gate = "cluster.gate.busbw_gbps={tp_all_reduce:100}"
    tp4 = compose("train_segment", ["experiment=smoke", "parallel=tp2", "parallel.tp=4", "model.n_kv_heads=4", gate])
    assert verdict(tp4, "n2", ranks(busbw=0.5)) == (
        True,
        "passed: 2 rank(s), matmul error <= 1e-07, in-node all_reduce 0.5 GB/s",
    )


def test_the_cpu_s_matmul_is_well_within_the_tolerance():
    assert matmul_error(torch.device("cpu")) < MATMUL_TOLERANCE / 100
