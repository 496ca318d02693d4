"""Goodput drills through the real local launcher: the stage restarts its own job after a dead rank, names a hung one
within the heartbeat's threshold, skips a NaN step, and refuses to restart what a restart cannot fix.

Each drill trains one segment of 6 steps on 2 ranks (dp2, gloo, deterministic), checkpoints every 2 steps, and ends
bit for bit where an uninterrupted run ends.
"""

from __future__ import annotations

import json
import re
import socket
import time
from pathlib import Path

import pytest
from submitit.core.utils import JobPaths

from tests.conftest import make_config, run_segment, step_losses
from tests.support import RESTART_RUN, ledgers
from trainflow.launch import LaunchError
from trainflow.launch.hang import HANG_EXIT
from trainflow.launch.restart import straggler_hosts
from trainflow.resilience.ledger import FaultClass
from trainflow.resilience.timing import RankTiming, stragglers

BASE = RESTART_RUN


def segment(root: Path, tokens: Path, *extra: str) -> dict:
    return run_segment(root, tokens, *BASE, *extra)


@pytest.fixture(scope="module")
def reference(tmp_path_factory, tokens) -> dict:
    return segment(tmp_path_factory.mktemp("reference"), tokens)


def assert_goodput_adds_up(summary: dict) -> dict:
    """The measured terms sum to the wall time within 2 %, and nothing but the productive steps is most of it."""
    goodput = summary["goodput"]
    assert goodput["unaccounted"] < 0.02, goodput
    assert goodput["seconds"]["other"] < 0.02 * goodput["wall_s"], goodput
    assert 0 < goodput["goodput"] == pytest.approx(goodput["seconds"]["productive"] / goodput["wall_s"])
    return goodput["seconds"]


def test_a_dead_rank_ends_the_job_fast_and_the_stage_restarts_it_bitwise(tmp_path, tokens, reference):
    # Rank 1 is also a straggler (it sleeps in every forward, which leaves the numbers as they are): the dead job's
    # heartbeat timing file names its host for the restart to leave out. Rank 0 wrote it once both ranks had timed
    # 3 steps; beats every 0.2 s see them well before rank 1 dies at the start of step 5.
    drill = ("fault.step=5", "fault.rank=1", "fault.signal=KILL", "fault.slow_ms=300")
    slow = ("resilience.exclude_stragglers=true", "resilience.heartbeat_s=0.2")
    summary = segment(tmp_path, tokens, *drill, *slow)
    jobs, spans = ledgers(tmp_path, *slow)
    assert [j.outcome for j in jobs] == ["died", "completed"]
    host = socket.gethostname()
    assert jobs[0].verdict == f"restart 1 of 3, leaving out {host}"  # one machine: recorded, not applied
    submitit = Path(make_config("train_segment", tmp_path, *BASE, *slow).io.submitit)
    assert straggler_hosts(JobPaths(submitit, job_id=jobs[0].job_id), 1.5) == {host}
    assert re.match(rf"rank 1 on host {re.escape(host)} was killed by SIGKILL", jobs[0].line)
    # The other rank was ended within failure_detect_s (30 s) + 10 s of the death: the first job's last span (rank 0
    # finished step 4 just before rank 1 died at the start of step 5) to its end as the stage saw it.
    last = max(s.started + s.seconds for s in spans if s.started < jobs[0].ended)
    assert jobs[0].ended - last < 40
    assert summary["state_digest"] == reference["state_digest"]
    assert step_losses(summary) == step_losses(reference)
    seconds = assert_goodput_adds_up(summary)
    assert seconds["recomputed"] > 0 or seconds["detection"] > 0  # step 4 redone after the restart from step 4
    assert seconds["load"] > 0 and seconds["restart"] >= 0


@pytest.mark.slow  # four jobs: ~45 s on a quiet machine
def test_failures_with_progress_between_them_never_use_up_the_budget_and_a_rerun_keeps_the_host_out(
    tmp_path, tokens, reference
):
    # max_restarts=1, and rank 1 dies twice: at the start of step 3 (checkpoint 2 saved) and, in the restarted job, of
    # step 5 (checkpoint 4 saved). Each restart trained a checkpoint interval, so each is the first of its streak: a
    # per-segment count would have stopped at the second. A rerun of the finished segment submits nothing (its work is
    # done); the campaign's next segment leaves the host out again (one machine: recorded, not applied), read from the
    # run's jobs ledger.
    twice = ("fault.step=3", "fault.rank=1", "fault.signal=KILL", "fault.strikes=2", "fault.stride=2")
    budget = ("resilience.max_restarts=1",)
    summary = segment(tmp_path, tokens, *twice, *budget)
    jobs, _ = ledgers(tmp_path, *budget)
    host = socket.gethostname()
    assert [j.outcome for j in jobs] == ["died", "died", "completed"]
    assert [j.verdict for j in jobs[:2]] == [f"restart 1 of 1, leaving out {host}"] * 2
    assert [j.checkpoint for j in jobs] == [2, 4, 6] and jobs[0].left_out == [host]
    assert summary["state_digest"] == reference["state_digest"]
    segment(tmp_path, tokens, *budget)
    assert len(ledgers(tmp_path, *budget)[0]) == 3
    segment(tmp_path, tokens, *budget, "train.segments=2", "segment=1")
    jobs, _ = ledgers(tmp_path, *budget)
    assert len(jobs) == 4 and jobs[3].exclude == [host] and jobs[3].outcome == "completed"


def test_a_hung_rank_is_named_within_the_threshold_with_every_live_rank_s_stacks(tmp_path, tokens):
    threshold = 5
    start = time.monotonic()
    hang = (f"resilience.hang_detect_s={threshold}", "resilience.heartbeat_s=1", "resilience.max_restarts=0")
    with pytest.raises(LaunchError) as err:
        segment(tmp_path, tokens, "fault.step=3", "fault.rank=1", "fault.signal=STOP", *hang)
    line = str(err.value)
    assert "\n" not in line
    assert re.search(
        # rank 1's last beat may be of an earlier step (its heartbeat thread publishes once a second)
        rf"rank 1 on host {re.escape(socket.gethostname())} stopped responding for \d+ s \(its last beat: step "
        rf"-?[0-3], (start|eval|data|compute|save)\), past resilience.hang_detect_s \({threshold} s: a stopped "
        r"process, or one stuck in a driver call\); rank 0 waited in torch\.[\w.]+ \(trainflow/[\w/]+\.py:\d+, "
        r"\w+\)",
        line,
    ), line
    jobs, spans = ledgers(tmp_path, *hang)
    stopped = max(s.started + s.seconds for s in spans)  # rank 1 stopped at the start of step 3, after the last span
    assert jobs[0].ended - stopped < threshold + 10
    folder = Path(make_config("train_segment", tmp_path, *BASE, *hang).io.submitit)
    stacks = folder / f"{jobs[0].job_id}_0_stacks.txt"
    assert "Thread" in stacks.read_text() and "trainflow" in stacks.read_text()
    assert json.loads((folder / f"{jobs[0].job_id}_hang.json").read_text())["rank"] == 1
    # Rank 0's word on who was slow, though the job lived less than a minute: written once both ranks had timed
    # 3 steps, and again as it aborted
    timing = json.loads((folder / f"{jobs[0].job_id}_timing.json").read_text())
    assert [RankTiming.from_json(t).rank for t in timing] == [0, 1]
    assert f"exit code {HANG_EXIT}" in (folder / f"{jobs[0].job_id}_0_log.err").read_text()
    assert time.monotonic() - start < 120


def test_a_stalled_main_thread_is_blamed_on_its_rank_by_the_collective_the_others_wait_in(tmp_path, tokens):
    # Rank 1's main thread blocks at the start of step 3 while its heartbeat beats on: both ranks are alive and
    # without progress at step 3 (the old tie-break blamed rank 0). The collective counts show rank 0 inside the
    # dp all-reduce that rank 1 never entered; every live rank's stacks and Flight Recorder are written before the job
    # ends.
    hang = ("resilience.hang_detect_s=4", "resilience.heartbeat_s=1", "resilience.max_restarts=0")
    with pytest.raises(LaunchError) as err:
        segment(tmp_path, tokens, "fault.step=3", "fault.rank=1", "fault.signal=STALL", *hang)
    line = str(err.value)
    assert "\n" not in line
    assert re.search(
        rf"rank 1 on host {re.escape(socket.gethostname())} made no progress for \d+ s .* a stuck main thread: it had "
        r"not entered collective \d+ of process group \S+, in which rank 0 waited\); rank 0 waited in torch\.",
        line,
    ), line
    # Their Flight Recorders, read side by side (each rank's digest of its newest collective per group), name the
    # collective: its op, number and sizes (resilience.flight)
    said = re.search(
        r"Flight Recorder: rank 0 waits in gloo:(\w+) #(\d+) of process group .*, which rank 1 issued up to #(\d+)",
        line,
    )
    assert said and int(said[3]) < int(said[2]), line
    jobs, _ = ledgers(tmp_path, *hang)
    assert jobs[0].outcome == "hang" and jobs[0].verdict.startswith("not restarted")
    folder = Path(make_config("train_segment", tmp_path, *BASE, *hang).io.submitit)
    for rank in (0, 1):
        assert "Thread" in (folder / f"{jobs[0].job_id}_{rank}_stacks.txt").read_text()
        assert (folder / f"{jobs[0].job_id}_{rank}_flight.json").is_file()
        digest = json.loads((folder / f"{jobs[0].job_id}_{rank}_flight_newest.json").read_text())  # what was read
        assert digest["entries"] and len(digest["entries"]) <= 8


@pytest.mark.slow  # 26 s; the hung rank named by its evidence stays in the default suite
def test_a_symmetric_hang_blames_no_host_until_the_gate_s_checks_ran(tmp_path, tokens, reference):
    # Every rank blocks in one collective that never completes (fault.signal=WEDGE: a failed link or switch): the
    # counts are equal, so no rank is named. Before the restart the gate's job times the layout's collectives on the
    # allocation (here all fast: no host found); the restart leaves no host out and ends bitwise. (At step 5: the
    # last phase before it is step 4's compute; a hang inside a save is left to the collective timeout.)
    hang = ("resilience.hang_detect_s=4", "resilience.heartbeat_s=1")
    summary = segment(tmp_path, tokens, "fault.step=5", "fault.signal=WEDGE", *hang)
    jobs, _ = ledgers(tmp_path, *hang)
    assert [j.outcome for j in jobs] == ["hang", "completed"]
    assert "every rank made no progress for" in jobs[0].line and "so no host is blamed" in jobs[0].line
    assert jobs[0].verdict == "restart 1 of 3 (the gate's checks on a new allocation found no slow host)"
    assert jobs[0].left_out == [] and jobs[1].exclude == []
    assert summary["state_digest"] == reference["state_digest"]


def test_a_nan_step_is_skipped_and_a_rerun_with_the_same_fault_is_bitwise_equal(tmp_path, tokens, reference):
    # The second run also has a straggler (rank 1 sleeps in every forward): flagged, and the numbers do not change.
    runs = [segment(tmp_path / "a", tokens, "fault.nan_step=3")]
    runs.append(segment(tmp_path / "b", tokens, "fault.nan_step=3", "fault.rank=1", "fault.slow_ms=300"))
    for run in runs:
        records = run["steps"]
        assert [r["step"] for r in records if r["skipped"]] == [3]
        assert records[3]["skipped"] == "loss nan"
        assert [e["action"] for e in run["guard"]] == ["skipped"]
    assert runs[0]["state_digest"] == runs[1]["state_digest"] != reference["state_digest"]
    assert step_losses(runs[0]) == step_losses(runs[1])
    assert step_losses(runs[0])[:3] == step_losses(reference)[:3]
    timings = [[RankTiming.from_json(t) for t in run["ranks"]] for run in runs]
    assert [t.rank for t in timings[0]] == [0, 1] and stragglers(timings[0], 1.5) == []
    assert [t.rank for t in stragglers(timings[1], 1.5)] == [1]


def test_a_config_error_is_not_restarted_and_fails_in_one_line(tmp_path, tokens):
    (tmp_path / "empty").mkdir()
    nothing = f"io.resume_from={tmp_path / 'empty'}"  # segment 1 of a series continued by hand, from no checkpoint
    with pytest.raises(LaunchError) as err:
        segment(tmp_path, tokens, "train.segments=2", "segment=1", nothing)
    line = str(err.value)
    assert "\n" not in line and "holds no valid checkpoint at or before step 12" in line
    assert "not restarted: trainflow refused an input, which a new job would refuse again" in line
    jobs, _ = ledgers(tmp_path, "train.segments=2", "segment=1", nothing)
    assert len(jobs) == 1


@pytest.mark.slow  # three jobs: ~35 s on a quiet machine
def test_two_cuda_errors_no_node_confirms_are_both_restarted_blaming_no_host(tmp_path, tokens, reference):
    # Rank 1 raises an illegal memory access at step 3 and, in the restarted job, an ECC error at step 5: two
    # exceptions whose tracebacks end in the same hints (once judged "the same exception in two jobs: the code
    # fails"). This host's kernel log holds no device Xid and NVML has no GPU here: no node confirms a device fault,
    # so each is restarted with no host left out (resilience.verdict; tests/unit/test_verdict_evidence.py).
    cuda = ("fault.step=3", "fault.rank=1", "fault.signal=CUDA", "fault.strikes=2", "fault.stride=2")
    summary = segment(tmp_path, tokens, *cuda)
    jobs, _ = ledgers(tmp_path)
    assert [j.outcome for j in jobs] == ["raised", "raised", "completed"]
    assert "an illegal memory access" in jobs[0].line and "uncorrectable ECC error" in jobs[1].line
    assert [j.fault for j in jobs[:2]] == [FaultClass.UNCONFIRMED] * 2 and [j.left_out for j in jobs] == [[]] * 3
    assert all(j.verdict.startswith("restart 1 of 3 (no host blamed: no node's evidence confirms") for j in jobs[:2])
    assert summary["state_digest"] == reference["state_digest"]


def test_a_rollback_past_max_rollbacks_stops_the_segment_in_one_line(tmp_path, tokens):
    bounded = ("fault.nan_step=3", "train.spike.rollback_after=1", "resilience.max_rollbacks=0")
    with pytest.raises(LaunchError) as err:
        segment(tmp_path, tokens, *bounded)
    line = str(err.value)
    assert "\n" not in line and "the loss diverges: 1 bad steps in a row from step 3 (the last: loss nan)" in line
    assert "past resilience.max_rollbacks (0)" in line and "not restarted: trainflow refused an input" in line


@pytest.mark.slow
def test_a_rollback_leaves_the_bad_window_out_and_a_resumed_run_draws_as_the_whole_one(tmp_path, tokens):
    rollback = ("fault.nan_step=3", "train.spike.rollback_after=1")
    whole = segment(tmp_path / "whole", tokens, "train.segment_steps=8", *rollback)
    halves = [
        segment(tmp_path / "halves", tokens, "train.segments=2", "train.segment_steps=4", f"segment={s}", *rollback)
        for s in (0, 1)
    ]
    (event,) = whole["guard"]
    # the bad window by its global sample positions (GuardEvent format 2): step 3's batch of 4, samples 12 to 16
    assert (event["action"], event["step"], event["from_step"], event["windows"]) == ("rolled back", 2, 3, [[12, 16]])
    assert halves[0]["guard"] == [event] and halves[1]["guard"] == []
    assert not any(r["skipped"] for run in (whole, *halves) for r in run["steps"])  # redone steps drew other windows
    assert step_losses(*halves) == step_losses(whole)
    assert halves[1]["state_digest"] == whole["state_digest"]  # segment 1 read the skipped window from the manifest
    assert whole["goodput"]["seconds"]["recomputed"] > 0
