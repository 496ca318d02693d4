"""Hot restarts through the real local launcher (cluster.allocation.spare_nodes, launch.supervisor): after a dead or a
stalled rank the job's supervisor starts the ranks again inside the same local job, from the newest verified checkpoint,
and the segment ends bit for bit where an uninterrupted run ends; once the spares are used up the next restart is a
new job.

Each drill trains RESTART_RUN's segment (6 steps on 2 ranks, dp2, gloo, a checkpoint every 2 steps).
"""

from __future__ import annotations

import socket
from pathlib import Path

import pytest

from tests.conftest import make_config, run_segment
from tests.support import RESTART_RUN, ledgers
from trainflow.config.startup import RANK_PARTS

HOT = ("cluster.allocation.spare_nodes=1",)


def segment(root: Path, tokens: Path, *extra: str) -> dict:
    return run_segment(root, tokens, *RESTART_RUN, *HOT, *extra)


def submitted_jobs(root: Path, *extra: str) -> list[Path]:
    """The jobs the stage submitted (submitit's pickles at the top of its folder; a step's lie in the step's folder)."""
    folder = Path(make_config("train_segment", root, *RESTART_RUN, *HOT, *extra).io.submitit)
    return sorted(folder.glob("*_submitted.pkl"))


@pytest.fixture(scope="module")
def reference(tmp_path_factory, tokens) -> dict:
    return run_segment(tmp_path_factory.mktemp("reference"), tokens, *RESTART_RUN)


@pytest.mark.slow  # a reference run and a job of two steps: 230 s at load 18-25 on the 2-core VM
def test_a_dead_rank_is_restarted_inside_its_job_on_a_spare_bitwise(tmp_path, tokens, reference):
    summary = segment(tmp_path, tokens, "fault.step=3", "fault.rank=1", "fault.signal=KILL")
    jobs, spans = ledgers(tmp_path, *HOT)
    assert [(j.outcome, j.step) for j in jobs] == [("died", 0), ("completed", 1)]
    job = jobs[0].job_id.removesuffix(".0")
    assert jobs[1].job_id == f"{job}.1" and len(submitted_jobs(tmp_path)) == 1  # one job, two steps
    assert jobs[0].verdict == f"restart 1 of 3, leaving out {socket.gethostname()}"  # one machine: recorded
    assert 0 < jobs[1].first_step_s < 60, jobs[1]
    first = min(s.started + s.seconds for s in spans if s.kind == "step" and s.started > jobs[0].ended)
    assert jobs[1].first_step_s == pytest.approx(first - jobs[0].ended, abs=1.0)  # the marker's time is the span's
    # first_step_s in parts: the supervisor's verdict (the failure seen to the new step asked for), then each part of
    # the ranks' start-up as their task markers recorded it, in order (none negative), adding up to it.
    parts = jobs[1].parts
    assert list(parts) == [p.value for p in RANK_PARTS] and min(parts.values()) >= 0, parts
    verdict = jobs[1].submitted - jobs[0].ended
    assert verdict + sum(parts.values()) == pytest.approx(jobs[1].first_step_s, abs=0.5), (verdict, parts, jobs[1])
    assert summary["state_digest"] == reference["state_digest"]


@pytest.mark.slow  # a job of two steps, the first ended by the heartbeat after 4 s
def test_a_stalled_rank_is_named_and_restarted_inside_its_job_bitwise(tmp_path, tokens, reference):
    # Rank 1's main thread blocks at step 3 while its heartbeat thread beats on: the heartbeat names it after 4 s.
    hang = ("resilience.hang_detect_s=4", "resilience.heartbeat_s=1")
    summary = segment(tmp_path, tokens, "fault.step=3", "fault.rank=1", "fault.signal=STALL", *hang)
    jobs, _ = ledgers(tmp_path, *HOT, *hang)
    assert [(j.outcome, j.step) for j in jobs] == [("hang", 0), ("completed", 1)]
    host = socket.gethostname()
    assert jobs[0].line.startswith(f"rank 1 on host {host} made no progress"), jobs[0].line
    assert jobs[0].left_out == [host] and len(submitted_jobs(tmp_path, *hang)) == 1
    assert 0 < jobs[1].first_step_s < 60, jobs[1]
    assert summary["state_digest"] == reference["state_digest"]


@pytest.mark.slow  # three steps of two jobs: ~60 s on a quiet machine
def test_once_the_spares_are_used_up_the_next_restart_is_a_new_job(tmp_path, tokens, reference, caplog):
    # Rank 1 dies at step 3 and, in the hot-restarted step, at step 5: the one spare is spent, so the stage submits a
    # new job (a supervisor again, with its own spare), which meets no fault.
    twice = ("fault.step=3", "fault.rank=1", "fault.signal=KILL", "fault.strikes=2", "fault.stride=2")
    summary = segment(tmp_path, tokens, *twice)
    jobs, _ = ledgers(tmp_path, *HOT)
    assert [(j.outcome, j.step) for j in jobs] == [("died", 0), ("died", 1), ("completed", 0)]
    assert jobs[1].verdict.startswith("restart") and len(submitted_jobs(tmp_path)) == 2
    assert jobs[2].job_id.split(".")[0] != jobs[0].job_id.split(".")[0]
    handed = [r.getMessage() for r in caplog.records if "handed back" in r.getMessage()]
    assert len(handed) == 1 and handed[0].endswith("the job's 1 spare node(s) are used up: a new job"), handed
    assert summary["state_digest"] == reference["state_digest"]


@pytest.mark.slow  # a job of a wedged step, a check step and a training step: ~40 s
def test_a_symmetric_hang_is_checked_inside_its_job_and_restarted_there_bitwise(tmp_path, tokens, reference):
    # Every rank waits in one collective that never completes (fault.signal=WEDGE: a failed link or switch), so no
    # rank's evidence names a host: the supervisor runs the gate's checks as a step of the same job on the step's own
    # hosts (its folder <job>-check.0), finds no slow host, and restarts training in the same job, blaming nobody.
    hang = ("resilience.hang_detect_s=4", "resilience.heartbeat_s=1")
    summary = segment(tmp_path, tokens, "fault.step=5", "fault.signal=WEDGE", *hang)
    jobs, _ = ledgers(tmp_path, *HOT, *hang)
    assert [(j.outcome, j.step) for j in jobs] == [("hang", 0), ("completed", 1)]
    assert jobs[0].verdict == "restart 1 of 3 (the gate's checks inside the job found no slow host)", jobs[0]
    assert jobs[0].left_out == [] and len(submitted_jobs(tmp_path, *hang)) == 1  # one job: no new allocation
    job = jobs[0].job_id.removesuffix(".0")
    folder = Path(make_config("train_segment", tmp_path, *RESTART_RUN, *HOT, *hang).io.submitit)
    assert list((folder / f"{job}-check.0").glob("*_0_result.pkl")), sorted(folder.iterdir())
    assert summary["state_digest"] == reference["state_digest"]
