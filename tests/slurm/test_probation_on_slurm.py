"""A blamed host's way back, read from the local cluster's Slurm (resilience.probation, launch.slurm_nodes): a node
in service since its blame stays out; drained it is held (and skipped as a spare); resumed it returns, each a line of
hosts.jsonl. A node Slurm keeps in service returns once its health check, a job on it alone, passes
(launch.health_check). The node is resumed at the end, whatever happens; a node running a job of a concurrent run is
not used.

    bash scripts/slurm_cluster.sh start && .venv/bin/python -m pytest tests/slurm/test_probation_on_slurm.py
"""

from __future__ import annotations

import subprocess
import time

import pytest

from tests.conftest import make_config
from trainflow.launch.health_check import SlurmHealthChecks
from trainflow.launch.slurm_nodes import on_probation, scontrol_nodes, usable_spares
from trainflow.resilience.ledger import JobOutcome, JobRun, hosts_ledger

pytestmark = pytest.mark.slurm

REASON = "trainflow probation test"
IN_SERVICE_S = 30
"""How long a resumed node may take to read in service again (it passes through IDLE+NOT_RESPONDING)."""


def idle_node() -> str:
    out = subprocess.run(["sinfo", "-h", "-N", "-o", "%N %t"], capture_output=True, text=True, check=True).stdout
    idle = sorted(name for name, state in (line.split() for line in out.splitlines()) if state == "idle")
    if not idle:
        pytest.skip("no idle node in the local cluster (a concurrent run uses them all)")
    return idle[-1]


def scontrol_update(node: str, *args: str) -> None:
    subprocess.run(["scontrol", "update", f"nodename={node}", *args], capture_output=True, text=True, check=True)


def test_a_drained_then_resumed_node_leaves_probation(tmp_path):
    node, ckpts = idle_node(), str(tmp_path)
    blamed = time.time() - 1
    jobs = [JobRun(0, 0, "1", blamed - 10, blamed - 5, blamed, JobOutcome.DIED, left_out=[node])]
    try:
        assert on_probation(ckpts, jobs, scontrol_nodes) == {node}  # in service, never held since its blame
        scontrol_update(node, "state=drain", f"reason={REASON}")
        assert on_probation(ckpts, jobs, scontrol_nodes) == {node}  # held: the repair has begun
        assert usable_spares([node], scontrol_nodes) == []
        scontrol_update(node, "state=resume")
        deadline = time.monotonic() + IN_SERVICE_S
        while not scontrol_nodes([node])[node].in_service and time.monotonic() < deadline:
            time.sleep(0.5)
        assert on_probation(ckpts, jobs, scontrol_nodes) == frozenset()
    finally:
        subprocess.run(["scontrol", "update", f"nodename={node}", "state=resume"], capture_output=True, text=True)
    held, back = hosts_ledger(ckpts).read()
    assert (held.kind, back.kind, back.host, back.blamed_by) == ("held", "returned", node, "job 1")
    assert held.evidence.startswith(f"Slurm holds it out: IDLE+DRAIN, reason '{REASON} [")
    assert back.evidence.startswith("Slurm has it IDLE after the hold seen at ")


@pytest.mark.parametrize(
    "overrides, kind, found",
    [
        ((), "returned", "passed: 2 rank(s), matmul error <= "),
        pytest.param(
            ("parallel=tp2", "cluster.gate.busbw_gbps={tp_all_reduce:1000000}"),
            "check failed",
            "failed: in-node all_reduce at ",
            marks=pytest.mark.slow,
        ),
    ],
    ids=["passes", "below-the-gate"],
)
def test_a_node_in_service_returns_once_its_health_check_job_on_it_passes(tmp_path, overrides, kind, found):
    # The smoke layout's two ranks a node: the check sweeps all_reduce between them, and with tp2 (which a node
    # holds) the gate's tp_all_reduce threshold applies: one no link meets keeps the node out.
    node = idle_node()
    settings = ("cluster=slurm_local", "resilience.health_check_after_s=1", *overrides)
    cfg = make_config("train_segment", tmp_path, *settings)
    blamed = time.time() - 2
    jobs = [JobRun(0, 0, "1", blamed - 10, blamed - 5, blamed, JobOutcome.DIED, left_out=[node])]
    checks, ckpts = SlurmHealthChecks(cfg), cfg.io.checkpoints
    assert on_probation(ckpts, jobs, scontrol_nodes, checks=checks) == {node}  # its check submitted, not waited for
    deadline = time.monotonic() + 120
    while len(hosts_ledger(ckpts).read()) < 2 and time.monotonic() < deadline:
        on_probation(ckpts, jobs, scontrol_nodes, checks=checks)
        time.sleep(1)
    submitted, ended = hosts_ledger(ckpts).read()
    assert (submitted.kind, ended.kind, ended.host, ended.check_job) == ("checking", kind, node, submitted.check_job)
    assert ended.evidence.startswith(f"its health check (job {ended.check_job}) {found}"), ended.evidence
    assert on_probation(ckpts, jobs, scontrol_nodes, checks=checks) == ({node} if kind == "check failed" else set())
