"""The checks of verify_checkpoint and validate_nccl, on inputs made here."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from trainflow.checkpoint.folders import step_dir
from trainflow.checkpoint.manifest import write_manifest
from trainflow.config import ClusterConfig
from trainflow.stage import StageError
from trainflow.stages.validate_nccl import gate
from trainflow.stages.verify_checkpoint import verify_all


def make_checkpoint(root, step: int) -> None:
    folder = step_dir(root, step)
    folder.mkdir(parents=True)
    for rank in range(2):
        (folder / f"__{rank}_0.distcp").write_bytes(os.urandom(3000))
    (folder / ".metadata").write_bytes(os.urandom(100))
    write_manifest(folder, step=step)


def test_verify_all_checks_every_checkpoint_and_names_a_bad_file(tmp_path):
    for step in (2, 4):
        make_checkpoint(tmp_path, step)
    report = verify_all(tmp_path)
    assert [c["step"] for c in report["checkpoints"]] == [2, 4] and report["files"] == 6 and report["failures"] == []
    bad = step_dir(tmp_path, 2) / ".metadata"
    bad.write_bytes(b"truncated")
    with pytest.raises(StageError, match=r"1 checkpoint\(s\) failed verification, first: .*\.metadata: 9 bytes"):
        verify_all(tmp_path)
    with pytest.raises(StageError, match="holds no checkpoint"):
        verify_all(tmp_path / "empty")


def sweep_result(busbw: float, versions=(("2.21.5", "1.22.0"),)) -> dict:
    hosts = [{"versions": {"nccl": n, "libfabric": f}, "node": {}} for n, f in versions]
    return {"sweep": [{"bytes": 1 << 26, "busbw_gbps": busbw}], "hosts": hosts}


def test_gate_stops_below_the_threshold_and_on_misaligned_versions():
    cluster = ClusterConfig(min_busbw_gbps=200.0)
    assert gate(sweep_result(230.0), cluster) == []
    (low,) = gate(sweep_result(150.0), cluster)
    assert "busbw 150.000 GB/s" in low and "cluster.min_busbw_gbps(200.0)" in low
    (mixed,) = gate(sweep_result(230.0, versions=(("2.21.5", "1.22.0"), ("2.21.5", "1.15.2"))), cluster)
    assert "versions differ across nodes" in mixed


@pytest.mark.parametrize("stage", ["prepare_data", "stage_data", "verify_checkpoint", "account_energy"])
def test_stages_that_only_move_or_check_files_start_without_torch(stage):
    code = f"import sys, trainflow.stages.{stage}; assert 'torch' not in sys.modules, sorted(sys.modules)"
    subprocess.run([sys.executable, "-c", code], check=True, capture_output=True, text=True)
