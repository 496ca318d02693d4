"""Slurm jobs that end without a result: the stage waiting for them ends within a bound, in one line.

    bash scripts/slurm_cluster.sh start && .venv/bin/python -m pytest -m slow tests/slurm/test_job_end.py

The local cluster has no accounting (no sacct), so submitit alone never learns that a job ended and waits
forever for its missing results; trainflow.launch reads the job's state from scontrol and gives up once the
job has stayed ended for a few seconds. Each stage runs in a daemon thread joined with a bound, so a stage
that still waits fails the test (and its job is cancelled) instead of hanging it.
"""

from __future__ import annotations

import datetime
import re
import subprocess
import threading
import time
from collections.abc import Callable
from pathlib import Path

import pytest
import submitit

from tests.conftest import make_config
from tests.slurm.conftest import RUNNING, final_states
from trainflow.checkpoint.manager import list_steps
from trainflow.config import TrainflowConfig
from trainflow.launch import LaunchError, wait_job
from trainflow.stages import train_segment

pytestmark = pytest.mark.slurm

WORK = ("parallel=dp2", "train.segments=1", "train.global_batch=32", "train.log_every=10")
ENDED_WITHIN_S = 60
"""The most seconds between a job's end (Slurm's EndTime) and the end of the stage waiting for it."""


def run_bounded(cfg: TrainflowConfig, *, bound_s: float) -> tuple[str, float]:
    """Run the stage in a daemon thread: its LaunchError line and when it ended. If it still waits after bound_s
    (before trainflow.launch watched the job's state it waited forever), its job is cancelled and the test fails."""
    outcome: dict = {}

    def stage() -> None:
        try:
            train_segment.run(cfg)
        except LaunchError as err:
            outcome["error"] = str(err)
        outcome["at"] = time.time()

    thread = threading.Thread(target=stage, daemon=True)
    thread.start()
    thread.join(bound_s)
    if thread.is_alive():
        jobs = submitted(cfg)
        for job in jobs:
            cancel(job)
        pytest.fail(f"train_segment still waited for slurm job {', '.join(jobs)} {bound_s:.0f} s after it started")
    assert "error" in outcome, "the stage ended without a LaunchError"
    return outcome["error"], outcome["at"]


def submitted(cfg: TrainflowConfig) -> list[str]:
    """Ids of the Slurm jobs the stage submitted (submitit names its pickle after the job)."""
    return sorted(p.name.split("_")[0] for p in Path(cfg.io.submitit).glob("*_submitted.pkl"))


def cancel(job: str) -> None:
    """Cancel for good: held first, so a job whose tasks requeue it while being cancelled cannot start again;
    cancelled again until squeue shows it ended or no longer knows it."""
    subprocess.run(["scontrol", "hold", job], capture_output=True)
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        subprocess.run(["scancel", job], capture_output=True)
        state = subprocess.run(
            ["squeue", "-h", "-t", "all", "-j", job, "-o", "%T"], capture_output=True, text=True
        ).stdout.strip()
        if state not in RUNNING:
            return
        time.sleep(5)


def end_time(job: str) -> float:
    """Slurm's EndTime of an ended job (slurmctld keeps it MinJobAge = 300 s), as a Unix time."""
    out = subprocess.run(["scontrol", "show", "job", "-o", job], capture_output=True, text=True, check=True).stdout
    return datetime.datetime.fromisoformat(re.search(r"\bEndTime=(\S+)", out)[1]).timestamp()


def job_log(cfg: TrainflowConfig, job: str) -> str:
    path = Path(cfg.io.submitit) / f"{job}_0_log.err"
    return path.read_text(errors="replace") if path.exists() else ""


def cancel_when(cfg: TrainflowConfig, ready: Callable[[str], bool], *, besides: frozenset[str] = frozenset()) -> None:
    """scancel the stage's job (not one of `besides`) once ready(job) holds, from a thread: an operator stopping
    a training run."""

    def watch() -> None:
        deadline = time.monotonic() + 300
        while time.monotonic() < deadline:
            for job in set(submitted(cfg)) - besides:
                if ready(job):
                    subprocess.run(["scancel", job], check=True)
                    return
            time.sleep(0.5)

    threading.Thread(target=watch, daemon=True).start()


def assert_cancelled_line(line: str, job: str, root: Path) -> None:
    """The stage's line for a job cancelled mid-training: its state, why train_segment started no new job, and
    the step saved at the SIGTERM."""
    assert final_states([job]) == {job: "CANCELLED"}
    assert "\n" not in line
    assert re.fullmatch(
        rf"segment 0 failed: slurm job {job} ended CANCELLED without the results of ranks 0-1 \(full log: \S+\); "
        r"not restarted: Slurm ended the job \(CANCELLED\), which a new job would not undo; "
        rf"rerunning the workflow resumes it from step {list_steps(root)[-1]} "
        rf"\(newest checkpoint in {re.escape(str(root))}\)",
        line,
    ), line


@pytest.mark.slow
def test_job_that_used_up_its_requeues_ends_the_stage_and_the_rerun_resumes(tmp_path, tokens):
    """A 1-minute limit and USR2 10 s before it: slurmctld checks limits on a 30-second timer, so the signal
    comes 20-50 s into each run, after start-up (with 30 s it may come before submitit's handler is installed
    and kill the tasks). Below 50 minutes submitit counts every signal as a timeout: the first run saves and
    is requeued (max_requeues=1), the second saves and is not. The rerun, with the normal limit, is cancelled
    once it has resumed: the segment is far too long to finish."""
    work = (*WORK, "train.segment_steps=100000", "train.eval_every=100000", "checkpoint.interval_steps=1000")
    limited = make_config(
        "train_segment",
        tmp_path,
        *work,
        "cluster=slurm_local",
        "cluster.allocation.time_min=1",
        "cluster.allocation.signal_delay_s=10",
        "cluster.allocation.max_requeues=1",
        tokens=tokens,
    )
    line, ended_at = run_bounded(limited, bound_s=480)
    (job,) = submitted(limited)
    root = Path(limited.io.checkpoints)
    newest = list_steps(root)[-1]
    state = final_states([job])[job]
    assert "\n" not in line and state not in RUNNING, line
    assert re.fullmatch(
        rf"segment 0 failed: .*\bslurm job {job} (ended )?{state} after 1 requeue\b.*; not restarted: .*; "
        rf"rerunning the workflow resumes it from step {newest} \(newest checkpoint in {re.escape(str(root))}\)",
        line,
    ), line
    assert ended_at - end_time(job) <= ENDED_WITHIN_S, line

    # The same checkpoint series: the cluster settings are part of the training hash that names its folder.
    rerun = make_config(
        "train_segment", tmp_path, *work, "cluster=slurm_local", f"io.checkpoints={root}", tokens=tokens
    )
    resumed = f"Resumed from the checkpoint of step {newest} in {root}"
    cancel_when(rerun, lambda again: resumed in job_log(rerun, again), besides=frozenset({job}))
    line, ended_at = run_bounded(rerun, bound_s=240)
    (again,) = set(submitted(rerun)) - {job}
    assert resumed in job_log(rerun, again)
    assert list_steps(root)[-1] > newest
    assert_cancelled_line(line, again, root)
    assert ended_at - end_time(again) <= ENDED_WITHIN_S, line


def test_cancelled_job_ends_its_stage_and_is_not_requeued(tmp_path, tokens):
    """scancel sends SIGTERM: the trainer saves at the next step and every task ends, without the requeue it
    makes on USR2 (a requeue would undo the cancel); the job ends CANCELLED and the stage says so."""
    cfg = make_config(
        "train_segment",
        tmp_path,
        *WORK,
        "train.segment_steps=100000",
        "train.eval_every=100000",
        "checkpoint.interval_steps=20",
        "cluster=slurm_local",
        tokens=tokens,
    )
    root = Path(cfg.io.checkpoints)
    cancel_when(cfg, lambda job: bool(list_steps(root)))
    line, ended_at = run_bounded(cfg, bound_s=240)
    (job,) = submitted(cfg)
    assert "Requeued job" not in job_log(cfg, job)
    assert_cancelled_line(line, job, root)
    assert ended_at - end_time(job) <= ENDED_WITHIN_S, line


def test_a_job_pending_past_max_pending_s_is_cancelled_in_one_line(tmp_path):
    # A job Slurm will not start for an hour (--begin): the wait gives up after resilience.max_pending_s with
    # Slurm's reason, and cancels the job, instead of waiting on it for ever.
    executor = submitit.AutoExecutor(folder=tmp_path, cluster="slurm")
    executor.update_parameters(
        timeout_min=2, nodes=1, tasks_per_node=1, cpus_per_task=1, slurm_additional_parameters={"begin": "now+3600"}
    )
    job = executor.submit(int)
    start = time.monotonic()
    with pytest.raises(LaunchError) as err:
        wait_job(job, max_pending_s=6)
    line = str(err.value)
    assert "\n" not in line
    assert re.fullmatch(
        rf"slurm job {job.job_id} stayed pending for \d+ s \(Reason=BeginTime\), past resilience\."
        r"max_pending_s \(6 s\), and was cancelled; .*",
        line,
    ), line
    assert time.monotonic() - start < 30
    assert final_states([job.job_id])[job.job_id] == "CANCELLED"
