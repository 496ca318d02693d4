"""Tests against the real local Slurm cluster of scripts/slurm_cluster.sh (CI starts it).

Tests marked `slurm` skip, saying why, when `scripts/slurm_cluster.sh status` fails. The cluster is
machine-wide: jobs of concurrent runs share its nodes, so every test uses its own folders and job ids.
"""

from __future__ import annotations

import functools
import subprocess
import time

import pytest

from tests.conftest import REPO

START = "bash scripts/slurm_cluster.sh start"
RUNNING = {"PENDING", "CONFIGURING", "RUNNING", "COMPLETING", "REQUEUED", "SUSPENDED"}


@functools.cache
def cluster_down_reason() -> str | None:
    """Why the local cluster cannot be used (None: it is up)."""
    try:
        status = subprocess.run(
            ["bash", str(REPO / "scripts/slurm_cluster.sh"), "status"], capture_output=True, text=True, timeout=30
        )
    except (OSError, subprocess.TimeoutExpired) as err:
        return f"scripts/slurm_cluster.sh status did not answer ({err}); start the cluster: {START}"
    if status.returncode:
        return f"no local Slurm cluster (scripts/slurm_cluster.sh status exited {status.returncode}); start it: {START}"
    return None


def pytest_runtest_setup(item):
    # A hook, not an autouse fixture: it runs before module-scoped fixtures that submit jobs.
    if item.get_closest_marker("slurm") and (reason := cluster_down_reason()):
        pytest.skip(reason)


def idle_nodes() -> dict[str, int]:
    """Node name -> CPUs of the cluster's usable nodes."""
    out = subprocess.run(["sinfo", "-h", "-N", "-o", "%N %c %t"], capture_output=True, text=True, check=True).stdout
    return {
        name: int(cpus)
        for name, cpus, state in (line.split() for line in out.splitlines())
        if state in ("idle", "mix", "alloc")
    }


def final_states(job_ids: list[str], timeout_s: float = 30) -> dict[str, str]:
    """Slurm's final state of each job. A job's tasks may have returned their results while the job
    is still COMPLETING; finished jobs stay visible to squeue for MinJobAge = 300 s."""
    deadline = time.monotonic() + timeout_s
    while True:
        out = subprocess.run(
            ["squeue", "-h", "-t", "all", "-j", ",".join(job_ids), "-o", "%i %T"],
            capture_output=True,
            text=True,
            check=True,
        ).stdout
        states = dict(line.split() for line in out.splitlines())
        if not RUNNING & set(states.values()) or time.monotonic() > deadline:
            return states
        time.sleep(0.5)


def three_nodes() -> None:
    """Skip a drill of 2 nodes + 1 spare where the cluster has fewer than 3 idle nodes."""
    if len(idle_nodes()) < 3:
        pytest.skip("2 nodes + 1 spare need 3 idle nodes: bash scripts/slurm_cluster.sh start --nodes 3")


def scontrol(*args: str) -> None:
    subprocess.run(["scontrol", *args], capture_output=True, text=True)
