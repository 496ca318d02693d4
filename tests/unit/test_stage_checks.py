"""The checks of verify_checkpoint and validate_nccl, on inputs made here."""

from __future__ import annotations

import dataclasses
import os
import subprocess
import sys

import pytest

from tests.conftest import REPO
from trainflow.checkpoint.folders import step_dir
from trainflow.checkpoint.manifest import write_manifest
from trainflow.checkpoint.verify import VerifyError, verify_all
from trainflow.config import GateConfig
from trainflow.gate.nodes import mps_running, stripe_count
from trainflow.gate.patterns import judge
from trainflow.gate.report import HostFacts, NodeFacts, Stripes, SweepRow
from trainflow.gate.verdict import problems, version_problems
from trainflow.report.checklist import node_rows


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
    assert [c.step for c in report.checkpoints] == [2, 4] and report.files == 6 and report.failures == []
    bad = step_dir(tmp_path, 2) / ".metadata"
    bad.write_bytes(b"truncated")
    with pytest.raises(VerifyError, match=r"1 checkpoint\(s\) failed verification, first: .*\.metadata: 9 bytes"):
        verify_all(tmp_path)
    with pytest.raises(VerifyError, match="holds no checkpoint"):
        verify_all(tmp_path / "empty")


NODE = NodeFacts(thp=None, swap_used_kb=None, mps_daemon=False, gpu_slowdowns=None, gpu_why="no GPU")


def hosts_with(versions=(("2.21.5", "1.22.0"),)) -> list[HostFacts]:
    return [HostFacts(f"n{i}", NODE, {"nccl": n, "libfabric": f}) for i, (n, f) in enumerate(versions)]


def sweep_at(busbw: float) -> list[SweepRow]:
    return [SweepRow(bytes=1 << 26, time_s=1.0, algbw_gbps=busbw, busbw_gbps=busbw)]


def test_gate_stops_below_the_threshold_and_on_misaligned_versions():
    gate = GateConfig(min_busbw_gbps=200.0)
    assert problems(sweep_at(230.0), [], hosts_with(), None, gate) == []
    (low,) = problems(sweep_at(150.0), [], hosts_with(), None, gate)
    assert "busbw 150.000 GB/s" in low and "cluster.gate.min_busbw_gbps(200.0)" in low
    (mixed,) = problems(sweep_at(230.0), [], hosts_with((("2.21.5", "1.22.0"), ("2.21.5", "1.15.2"))), None, gate)
    assert "versions differ across nodes" in mixed


def test_the_version_table_names_each_node_off_it():
    hosts = hosts_with((("2.21.5", "1.22.0"), ("2.18.1", "1.22.0"), ("2.21.5", None)))
    nccl, libfabric = version_problems(hosts, {"nccl": ["2.20", "2.21"], "libfabric": ["1.22"]})
    assert nccl.startswith("nccl n1: 2.18.1 is not in cluster.gate.versions_allowed.nccl (2.20 | 2.21*)")
    assert libfabric.startswith("libfabric n2: None is not in")  # a component the table pins must be there
    assert version_problems(hosts, {}) == []


def test_patterns_are_judged_on_their_slowest_group_and_name_its_hosts():
    """dp2 x tp2 on 2 nodes (ranks 0, 1 on a; 2, 3 on b): tp groups {0, 1} and {2, 3}, dp groups {0, 2} and {1, 3}."""
    mb = 1 << 20
    # Per rank: its tp group, its dp group, its tp_all_reduce time (a group's time is its slowest member's).
    ranks = (([0, 1], [0, 2], 1e-3), ([0, 1], [1, 3], 2e-3), ([2, 3], [0, 2], 4e-3), ([2, 3], [1, 3], 1e-3))
    rows = [
        [
            {"pattern": "tp_all_reduce", "group": tp, "bytes": mb, "time_s": t_tp},
            {"pattern": "dp_all_reduce", "group": dp, "bytes": mb, "time_s": 1e-3},
        ]
        for tp, dp, t_tp in ranks
    ]
    table, exclude, everywhere = judge(rows, ["a", "a", "b", "b"], {"tp_all_reduce": 0.5})
    tp = next(r for r in table if r.pattern == "tp_all_reduce")
    assert tp.slowest_group == [2, 3] and tp.slowest_hosts == ["b"] and tp.groups == 2
    assert tp.busbw_gbps == pytest.approx(mb / 4e-3 / 1e9 * 2 * (2 - 1) / 2)  # nccl-tests' all_reduce factor
    assert tp.passed is False and exclude == ["b"] and everywhere == []  # group [0, 1] meets it: b is slow
    dp = next(r for r in table if r.pattern == "dp_all_reduce")
    assert dp.passed is None  # no gate for it: reported only
    (line,) = problems(sweep_at(1.0), table, hosts_with(), None, GateConfig(min_busbw_gbps=0.0))
    assert "tp_all_reduce busbw 0.262 GB/s on the slowest of its 2 groups (ranks [2, 3], hosts b)" in line


@pytest.mark.parametrize(
    ("tp_times", "exclude_expected"),
    [((4e-3, 4.1e-3, 4e-3, 4.2e-3), []), ((1e-3, 1e-3, 1e-3, 4e-3), ["a", "d"]), ((4e-3,), [])],
    ids=["every-group-below", "one-group-below", "one-group-alone"],
)
def test_a_threshold_no_group_meets_leaves_no_host_out(tp_times, exclude_expected):
    """The seed's case: tp groups that each cross two nodes (hosts a b, b c, ... as tp8 over 4-GPU nodes does) all
    below an in-node threshold; one slow group among fast ones is the hosts'; one group alone has no peers."""
    mb, hosts = 1 << 20, ["a", "b", "b", "c", "c", "d", "d", "a"]
    rows = [
        [{"pattern": "tp_all_reduce", "group": [2 * g, 2 * g + 1], "bytes": mb, "time_s": t}]
        for g, t in enumerate(tp_times)
        for _ in range(2)
    ]
    table, exclude, everywhere = judge(rows, hosts, {"tp_all_reduce": 0.5})
    assert table[0].passed is False and exclude == exclude_expected
    assert everywhere == ([] if exclude_expected else ["tp_all_reduce"])


@pytest.mark.parametrize("stage", ["prepare_data", "stage_data", "verify_checkpoint", "account_energy"])
def test_stages_that_only_move_or_check_files_start_without_torch(stage):
    code = f"import sys, trainflow.stages.{stage}; assert 'torch' not in sys.modules, sorted(sys.modules)"
    subprocess.run([sys.executable, "-c", code], check=True, capture_output=True, text=True)


def test_a_checkpoint_folder_striped_too_thin_stops_the_gate(tmp_path, monkeypatch):
    lfs = tmp_path / "bin/lfs"
    lfs.parent.mkdir()
    lfs.write_text("#!/bin/sh\necho 2\n")  # `lfs getstripe -c -d <folder>` on a folder striped over 2 targets
    lfs.chmod(0o755)
    monkeypatch.setenv("PATH", f"{lfs.parent}:{os.environ['PATH']}")
    count, source = stripe_count(str(tmp_path))
    assert (count, source) == (2, "lfs getstripe -c")
    gate = GateConfig(min_busbw_gbps=0.0, min_stripe_count=4)
    (line,) = problems(sweep_at(1.0), [], hosts_with(), count, gate)
    assert "stripe count 2 is below cluster.gate.min_stripe_count(4): lfs setstripe -c 4 <folder>" in line
    monkeypatch.setenv("PATH", str(tmp_path / "nowhere"))
    assert stripe_count(str(tmp_path)) == (None, "not applicable: no lfs command (not a Lustre file system)")


def test_node_checks_pass_fail_or_say_why_not(tmp_path):
    proc = tmp_path / "proc"
    for pid, name in (("1", "systemd"), ("77", "python")):
        (proc / pid).mkdir(parents=True)
        (proc / pid / "comm").write_text(name + "\n")
    assert not mps_running(proc)
    (proc / "78").mkdir()
    (proc / "78" / "comm").write_text("nvidia-cuda-mps-control\n")
    assert mps_running(proc)
    node = NodeFacts(thp="never", swap_used_kb=0, mps_daemon=False, gpu_slowdowns=None, gpu_why="no GPU here")
    hosts = [HostFacts("a", node, {}), HostFacts("b", dataclasses.replace(node, thp="always"), {})]
    rows = {row[0]: row[1:] for row in node_rows(hosts, Stripes("/ckpt", None, "n/a: no lfs"))}
    assert rows["transparent huge pages off"] == ["a: never, b: always", "FAIL on b"]
    assert rows["no MPS daemon (one process per GPU)"][1] == "pass"
    assert rows["no GPU clock slowdown (NVML: thermal, power brake)"] == ["-", "n/a (no GPU here)"]
    assert rows["checkpoint folder's Lustre stripe count"] == ["-", "n/a: no lfs"]


def test_the_dag_build_imports_no_torch():
    """Every trainflow import of the Snakefile and its rules, together: building the DAG (every workflow command and
    test) never waits for torch's import (an lm-eval name check importing the scorer once cost each build 1.3 s)."""
    lines = {
        line.strip()
        for path in [REPO / "Snakefile", *sorted((REPO / "workflow/rules").glob("*.smk"))]
        for line in path.read_text().splitlines()
        if line.startswith(("from trainflow", "import trainflow"))
    }
    assert len(lines) > 5, lines
    code = "\n".join(["import sys", *sorted(lines), "assert 'torch' not in sys.modules, sorted(sys.modules)"])
    subprocess.run([sys.executable, "-c", code], check=True, capture_output=True, text=True)
