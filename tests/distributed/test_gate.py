"""The collective gate on 4 gloo ranks: every pattern of the layout timed on its own groups, and a pattern
below its gate stops validate_nccl with the slowest group's hosts written as an exclude list."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.conftest import make_config, read_json
from trainflow.stage import StageError
from trainflow.stages import validate_nccl

SMALL = ("cluster.gate.sweep_mb=[1.0]", "cluster.gate.sweep_iters=2", "train.global_batch=8")


@pytest.mark.parametrize(
    ("layout", "patterns"),
    [
        pytest.param("dp2_tp2", {"dp_all_reduce", "tp_all_reduce"}, marks=pytest.mark.slow),  # and below
        ("dp2_shard_pp2", {"dp_all_reduce", "dp_reduce_scatter", "dp_all_gather", "pp_send_recv"}),
    ],
)
def test_every_pattern_of_the_layout_is_timed_on_its_groups(layout, patterns, tmp_path):
    cfg = make_config("validate_nccl", tmp_path, f"parallel={layout}", *SMALL)
    metrics = validate_nccl.run(cfg)
    assert metrics.ranks == 4 and metrics.rank_cpu_s > 0  # every rank's CPU time, for the stage's energy
    table = {row["pattern"]: row for row in read_json(cfg.io.nccl_report)["patterns"]}
    assert set(table) == patterns
    for row in table.values():
        assert row["groups"] == 2 and row["group_size"] == 2 and row["busbw_gbps"] > 0 and row["passed"]
    # The recorded plan stands on what the job measured: the block rate and the links (gate.calibrate).
    report = read_json(cfg.io.nccl_report)
    measured = {c["name"]: c["measured"] for c in report["calibration"]["constants"]}
    assert {"matmul_efficiency", "intra_node_gbps"} <= set(measured) and 0 < measured["matmul_efficiency"] <= 1
    assert all(report["plan"]["hardware"][name] == value for name, value in measured.items())
    assert report["calibration"]["configured_step_s"] > 0 and report["plan"]["step"]["step_s"] > 0


@pytest.mark.slow  # 12 s; the verdict's rule is tests/unit/test_stage_checks.py's, in the default suite
def test_a_pattern_no_group_meets_stops_the_gate_and_blames_no_host(tmp_path):
    """1e6 GB/s: no tp group can meet it, the layout's limit, not a host's (the exclude list is written only where
    another group of the pattern meets the threshold: tests/unit/test_stage_checks.py)."""
    cfg = make_config(
        "validate_nccl", tmp_path, "parallel=dp2_tp2", *SMALL, "cluster.gate.busbw_gbps.tp_all_reduce=1e6"
    )
    with pytest.raises(StageError, match=r"tp_all_reduce busbw .* below cluster.gate.busbw_gbps.tp_all_reduce") as err:
        validate_nccl.run(cfg)
    line = str(err.value)
    assert "no group of tp_all_reduce's 2 meets cluster.gate.busbw_gbps.tp_all_reduce(1000000.0)" in line, line
    assert "so it blames no host" in line and "sbatch --exclude" not in line and "\n" not in line
    assert not Path(cfg.io.nccl_report).with_name("nccl-exclude.txt").exists()
    assert not Path(cfg.io.nccl_report).exists()  # the gate failed: no report for training to start from
