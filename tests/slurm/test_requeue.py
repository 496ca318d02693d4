"""A segment longer than its Slurm time limit: pre-timeout USR2, checkpoint, requeue, resume, same result.

    bash scripts/slurm_cluster.sh start && .venv/bin/python -m pytest tests/slurm/test_requeue.py

The job gets a 1-minute limit and asks for USR2 10 s before it. slurmctld checks time limits on a
30-second timer and sends the signal once `delay + 30 s` or less remain, so it arrives 20-50 s into
each job and the job is killed 60-90 s in (with a 30 s delay it could arrive at any time in the first
30 s, before training started). Each step of the limited run first sleeps 300 ms (the straggler drill,
fault.slow_ms: no numerics change), so its 120 steps take over 60 s however fast the machine (unslowed,
a quiet one trains them in 36 s, before any signal); they are therefore interrupted at least once; every
interruption saves at the agreed step, submitit requeues the job (a limit under ~50 min makes submitit
count each signal as a timeout, hence max_requeues=5), and the requeued job, with SLURM_RESTART_COUNT >= 1,
resumes. An unlimited run of the same settings on local processes,
beside it (one CPU each), must end bit for bit the same.
"""

from __future__ import annotations

import re
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from tests.conftest import make_config, read_json
from trainflow.stages import train_segment

pytestmark = pytest.mark.slurm

WORK = (
    "parallel=single",
    "train.segments=1",
    "train.segment_steps=120",
    "train.global_batch=32",
    "train.eval_every=50",
    "train.log_every=10",
    "checkpoint.interval_steps=1000",
)
LIMITED = (
    "cluster=slurm_local",
    "fault.rank=0",
    "fault.slow_ms=300",
    "cluster.allocation.time_min=1",
    "cluster.allocation.signal_delay_s=10",
    "cluster.allocation.max_requeues=5",
)


@pytest.mark.slow  # 130 s of a 2-minute time limit; the local pre-timeout drill (test_fault_tolerance) holds the path
@pytest.mark.parametrize("mode", ["sync", "async"])
def test_time_limit_requeues_and_resumes_bitwise(tmp_path, tokens, mode):
    """In async mode each USR2 waits for the save in flight, saves, and waits for that one before the requeue."""
    work = (*WORK, f"checkpoint.mode={mode}")
    limited = make_config("train_segment", tmp_path / "limited", *work, *LIMITED, tokens=tokens)
    unlimited = make_config("train_segment", tmp_path / "unlimited", *work, tokens=tokens)
    with ThreadPoolExecutor(1) as beside:
        reference = beside.submit(train_segment.run, unlimited)
        train_segment.run(limited)
        reference.result()
    summary, expected = read_json(limited.io.segment_report), read_json(unlimited.io.segment_report)

    logs = "".join(p.read_text() for p in sorted(Path(limited.io.submitit).glob("*_0_log.*")))
    assert summary["completed"] and summary["restart_count"] >= 1, logs[-3000:]
    assert "Requeued job" in logs
    # Each interruption saved at the step the ranks agreed on, and the next job resumed there. On a loaded
    # machine the signal can come after the last step (during the final evaluation or summary): that saves
    # step 120, and the requeued job only finishes the segment.
    saved = [int(s) for s in re.findall(r"Resumed from the checkpoint of step (\d+)", logs)]
    assert saved and saved == sorted(saved) and 0 < saved[0] and saved[-1] <= 120, logs[-3000:]
    assert len(saved) == summary["restart_count"], logs[-3000:]
    assert summary["state_digest"] == expected["state_digest"]
    assert [r["loss"] for r in summary["steps"]] == [r["loss"] for r in expected["steps"]]
    assert summary["evals"] == expected["evals"]
