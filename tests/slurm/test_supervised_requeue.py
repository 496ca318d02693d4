"""A supervised job's time limit, drilled (issue 32): with cluster.allocation.spare_nodes the job's one task is the
supervisor (launch.supervisor), and Slurm's pre-timeout USR2 is the ranks' to act on: they agree, save, rank 0 requeues
the job, and the requeued job's supervisor starts a new step (numbered after the earlier ones) that resumes from that
checkpoint. The segment ends bit for bit where an unlimited run ends, in one Slurm job, no hot restart spent, and the
jobs ledger holds the step the time limit ended and the requeued job's step that completed.

    bash scripts/slurm_cluster.sh start && .venv/bin/python -m pytest -m slow tests/slurm/test_supervised_requeue.py

A 3-minute limit with the signal 60 s before it (notes/local-slurm.md: a 1-minute limit leaves too little on a loaded
2-core machine): slurmctld checks limits on a 30 s timer, so USR2 arrives 90-120 s into each job. Rank 0 sleeps 3 s in
every step (fault.slow_ms: no numerics change), so the 40 steps take over 120 s however fast the machine: the first job
is interrupted, and the requeued one trains the rest before its own signal. One node trains, one is the spare.
"""

from __future__ import annotations

import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from tests.conftest import make_config, read_json
from tests.slurm.conftest import idle_nodes
from trainflow.resilience.ledger import JobOutcome, jobs_ledger
from trainflow.stages import train_segment

pytestmark = [pytest.mark.slurm, pytest.mark.slow]

WORK = (
    "parallel=dp2",
    "train.segments=1",
    "train.segment_steps=40",
    "checkpoint.interval_steps=10",
    "cluster.runtime.collective_timeout_s=60",
    "resilience.heartbeat_s=1",
)
LIMITED = (
    "cluster=slurm_local",
    "cluster.allocation.nodes=1",
    "cluster.allocation.spare_nodes=1",
    "cluster.allocation.time_min=3",
    "cluster.allocation.signal_delay_s=60",
    "cluster.allocation.max_requeues=5",
    "fault.rank=0",
    "fault.slow_ms=3000",
)


def test_a_supervised_job_s_time_limit_is_requeued_and_resumes_bitwise(tmp_path, tokens):
    if len(idle_nodes()) < 2:
        pytest.skip("1 node + 1 spare need 2 idle nodes: bash scripts/slurm_cluster.sh start")
    limited = make_config("train_segment", tmp_path / "limited", *WORK, *LIMITED, tokens=tokens)
    unlimited = make_config("train_segment", tmp_path / "unlimited", *WORK, tokens=tokens)
    started = time.monotonic()
    with ThreadPoolExecutor(1) as beside:
        reference = beside.submit(train_segment.run, unlimited)
        train_segment.run(limited)
        reference.result()
    wall_s = time.monotonic() - started
    summary, expected = read_json(limited.io.segment_report), read_json(unlimited.io.segment_report)
    jobs = jobs_ledger(limited.io.checkpoints).read()
    folder = Path(limited.io.submitit)
    logs = "".join(p.read_text() for p in sorted(folder.glob("*/*_0_log.*")))
    print(f"drill: {wall_s:.0f} s, jobs.jsonl: {[j.to_json() for j in jobs]}")

    # One job (the supervisor's), requeued: its first step ended at the time limit, the requeued job's step completed.
    assert len(list(folder.glob("*_submitted.pkl"))) == 1, jobs
    assert summary["completed"] and summary["restart_count"] >= 1, logs[-3000:]
    assert "Requeued job" in logs, logs[-3000:]
    job = jobs[0].job_id.removesuffix(".0")
    assert [j.job_id for j in jobs] == [f"{job}.{k}" for k in range(len(jobs))], jobs
    assert [j.step for j in jobs] == list(range(len(jobs))) and len(jobs) >= 2, jobs
    *requeued, last = jobs
    assert all(j.outcome == JobOutcome.REQUEUED and not j.left_out for j in requeued), requeued
    assert last.outcome == JobOutcome.COMPLETED and last.first_step_s is None, last
    assert all(b.submitted >= a.ended for a, b in zip(jobs, jobs[1:])), jobs  # the requeue's wait between them
    assert [j.checkpoint for j in requeued] == sorted({j.checkpoint for j in requeued}) and requeued[0].checkpoint > 0
    assert summary["state_digest"] == expected["state_digest"]
    assert [r["loss"] for r in summary["steps"]] == [r["loss"] for r in expected["steps"]]
