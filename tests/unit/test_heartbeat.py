"""The heartbeat at scale and the hang's blame, on a real TCPStore in one process: rank 0's poll of 4096 simulated
ranks is one round trip, a rank that never published is reported silent, and the collective counts name the rank the
others wait for, or nobody in a symmetric hang. A rank is watched from its start (resilience.start_s), the stacks
watchdog cannot fire between healthy beats, and a threshold within a few beats is refused with fixes that compose."""

from __future__ import annotations

import json
import logging
import re
import time

import pytest
import torch
import torch.distributed as dist
from submitit.core.utils import JobPaths

from trainflow.config import ConfigError, compose
from trainflow.launch.hang import collective_counts, rank_environment, stacks_path
from trainflow.launch.heartbeat import NEVER, Heartbeat, beat_key
from trainflow.resilience.hang import BEAT_BYTES, Beat, HangReport, culprits, read_beat

pytestmark = pytest.mark.torch_compat  # TCPStore.multi_get / multi_set and the groups' sequence numbers


class Counting:
    """A store that counts its round trips."""

    def __init__(self, store) -> None:
        self.store, self.calls = store, 0

    def __getattr__(self, name):
        def call(*args):
            self.calls += 1
            return getattr(self.store, name)(*args)

        return call


def beat(
    rank: int, *, counter: int = 0, step: int = 5, phase: str = "compute", counts=None, marks=None, steps: int = 3
) -> str:
    marks = 2 * step + (phase == "compute") if marks is None else marks
    return Beat(counter, step, phase, marks, f"node{rank // 4}", 0.1, steps, counts or {}).text()


@pytest.fixture
def heartbeat(tmp_path):
    def build(world: int, **runtime):
        cfg = compose("train_segment", ["experiment=smoke", *(f"resilience.{k}={v}" for k, v in runtime.items())])
        server = dist.TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False)
        server.multi_set([beat_key(r) for r in range(world)], [NEVER] * world)
        store = Counting(server)
        return Heartbeat(
            cfg.cluster.runtime, cfg.resilience, rank=0, world=world, paths=JobPaths(tmp_path, job_id="1"), store=store
        )

    return build


def test_a_poll_of_4096_ranks_is_one_round_trip_and_a_rank_that_never_published_is_silent(heartbeat):
    world, silent = 4096, 2999
    beat_ = heartbeat(world, hang_detect_s=1, heartbeat_s=0.1)
    published = [r for r in range(world) if r != silent]
    beat_.store.store.multi_set([beat_key(r) for r in published], [beat(r) for r in published])
    beat_.store.calls = 0
    start = time.monotonic()
    assert beat_.watch() is None
    assert beat_.store.calls == 1 and time.monotonic() - start < 5
    time.sleep(1.2)
    beat_.store.store.multi_set([beat_key(r) for r in published], [beat(r, counter=1) for r in published])  # beats on
    report = beat_.watch()
    assert isinstance(report, HangReport) and report.rank == silent and not report.alive
    assert "stopped responding" in report.line()


def test_a_stalled_rank_is_blamed_by_the_collectives_the_others_wait_in(heartbeat):
    # dp2 x tp2: rank 3's main thread stalled before its tensor-parallel all-reduce, in which its tp peer 2 waits;
    # ranks 0 and 1 wait for ranks 2 and 3 in their dp all-reduce. Everyone is stuck at step 6; the counts name 3.
    counts = {
        0: {"world": 9, "dp0": 4, "tp0": 12},
        1: {"world": 9, "dp1": 4, "tp0": 12},
        2: {"world": 9, "dp0": 3, "tp1": 12},
        3: {"world": 9, "dp1": 3, "tp1": 11},
    }
    beat_ = heartbeat(4, hang_detect_s=1, heartbeat_s=0.1)
    for counter in range(2):
        beat_.store.store.multi_set([beat_key(r) for r in counts], [beat(r, counter=counter) for r in counts])
        assert beat_.watch() is None
    for counter, step in ((2, 6), (3, 6)):  # every rank moves to step 6 once: the first step is exempt
        values = [beat(r, counter=counter, step=step, counts=counts[r]) for r in counts]
        beat_.store.store.multi_set([beat_key(r) for r in counts], values)
        assert beat_.watch() is None
    time.sleep(1.2)
    values = [beat(r, counter=9, step=6, counts=counts[r]) for r in counts]
    beat_.store.store.multi_set([beat_key(r) for r in counts], values)
    report = beat_.watch()
    assert report.rank == 3 and report.host == "node0" and report.alive
    assert "had not entered collective 4 of process group dp1, in which rank 1 waited" in report.line()


@pytest.mark.parametrize(
    ("text", "words"),
    [
        ("{not json", "rank 1's beat in the heartbeat store is not JSON (JSONDecodeError)"),
        ("x" * (BEAT_BYTES + 1), f"holds {BEAT_BYTES + 1} bytes, more than a beat's"),
        (json.dumps({**Beat().to_json(), "counter": "1"}), "store.counter holds '1', not a int"),
        (json.dumps({**Beat().to_json(), "run": "rm -rf ~"}), "holds 'run', which Beat has no field for"),
        (json.dumps({**Beat().to_json(), "format": 9}), "Beat format 9, written by a newer trainflow"),
    ],
)
def test_a_beat_that_does_not_read_as_one_is_said_in_one_line_and_is_no_beat(heartbeat, caplog, text, words):
    """The store is the job network's to write: a value that is no beat is refused, once a rank, and its rank is
    watched as one that did not beat (silent past the threshold), never as the store failing."""
    assert read_beat(NEVER.encode(), where="seed") == Beat()
    beat_ = heartbeat(2, hang_detect_s=1, heartbeat_s=0.1)
    store = beat_.store.store
    store.multi_set([beat_key(0), beat_key(1)], [beat(0), beat(1)])
    assert beat_.watch() is None
    time.sleep(1.2)
    with caplog.at_level(logging.WARNING, logger="trainflow.launch.heartbeat"):
        for counter in (1, 2):
            store.multi_set([beat_key(0), beat_key(1)], [beat(0, counter=counter), text])
            report = beat_.watch()
            assert report is not None and report.rank == 1 and not report.alive
    said = [r.getMessage() for r in caplog.records if "left out a beat" in r.getMessage()]
    assert len(said) == 1 and words in said[0] and "\n" not in said[0]


def test_the_evidence_follows_a_chain_and_names_nobody_in_a_symmetric_hang():
    # 1 waits for 2 in group a, 2 waits for 3 in group b: 3 is the cause, not 2 (itself waiting)
    chain = {1: {"a": 5}, 2: {"a": 4, "b": 8}, 3: {"b": 7}}
    assert culprits(chain).culprits == (3,)
    assert culprits(chain).waiting == (2,) and culprits(chain).collective == 8
    symmetric = {r: {"world": 40, "dp": 20} for r in range(8)}
    assert culprits(symmetric).culprits == ()
    report = HangReport(
        rank=None,
        host="",
        step=6,
        phase="compute",
        seconds=7,
        alive=True,
        threshold_s=5,
        detected_by=0,
        waiting_in="torch.distributed.distributed_c10d.recv (trainflow/train/faults.py:70, wedge)",
        evidence=culprits(symmetric).line(),
    )
    assert report.line().startswith("every rank made no progress for 7 s (step 6), past resilience.hang_detect_s")
    assert "a symmetric hang), so no host is blamed" in report.line()
    assert HangReport.from_json(report.to_json()) == report


def test_collective_counts_are_read_per_group_and_leave_pipeline_groups_out(tmp_path):
    assert collective_counts() == {}  # before torch.distributed is set up
    store = dist.FileStore(str(tmp_path / "store"), 1)
    dist.init_process_group("gloo", store=store, rank=0, world_size=1)
    try:
        pp = dist.new_group([0], group_desc="mesh_pp")
        dp = dist.new_group([0], group_desc="mesh_dp")
        dist.all_reduce(torch.ones(1), group=dp)
        dist.all_reduce(torch.ones(1), group=pp)
        counts = collective_counts()
        names = dist.distributed_c10d._world.pg_names
        assert counts[names[dp]] == 1 and names[pp] not in counts
    finally:
        dist.destroy_process_group()


def test_a_long_evaluation_is_progress_batch_by_batch_not_a_hang(heartbeat):
    # Rank 0 evaluates batch after batch of step 6 for longer than the threshold, while rank 1 waits for it in the
    # next collective: each batch's marker is progress, so nothing is hung until the batches stop coming.
    beat_ = heartbeat(2, hang_detect_s=1, heartbeat_s=0.1)
    store = beat_.store.store
    for counter, step in enumerate((5, 6)):  # both ranks finish their first step
        store.multi_set([beat_key(r) for r in (0, 1)], [beat(r, counter=counter, step=step) for r in (0, 1)])
        assert beat_.watch() is None
    marks = 20
    for counter in range(2, 8):  # 1.5 s of evaluation, a batch every 0.25 s
        time.sleep(0.25)
        marks += 1
        values = [beat(0, counter=counter, step=6, phase="eval", marks=marks), beat(1, counter=counter, step=6)]
        store.multi_set([beat_key(0), beat_key(1)], values)
        assert beat_.watch() is None
    time.sleep(1.2)
    store.multi_set(
        [beat_key(r) for r in (0, 1)],
        [beat(0, counter=9, step=6, phase="eval", marks=marks), beat(1, counter=9, step=6)],
    )
    assert beat_.watch() is not None  # the batches stopped: now it is a hang


def test_the_flight_recorder_is_on_and_the_runtime_env_overrides_it(tmp_path):
    paths = JobPaths(tmp_path, job_id="7")
    nccl = compose("train_segment", ["experiment=smoke", "cluster.runtime.backend=nccl"]).cluster.runtime
    env = rank_environment(nccl, paths)
    assert env["TORCH_FR_BUFFER_SIZE"] == env["TORCH_NCCL_TRACE_BUFFER_SIZE"] == "20000"
    assert env["TORCH_NCCL_DUMP_ON_TIMEOUT"] == "1"
    assert env["TORCH_NCCL_DEBUG_INFO_TEMP_FILE"] == str(tmp_path / "7_nccl_trace_rank_")
    small = compose(
        "train_segment",
        ["experiment=smoke", "cluster.runtime.backend=nccl", "+cluster.runtime.env.TORCH_FR_BUFFER_SIZE=100"],
    )
    assert rank_environment(small.cluster.runtime, paths)["TORCH_FR_BUFFER_SIZE"] == "100"
    gloo = compose("train_segment", ["experiment=smoke"]).cluster.runtime
    assert {k: v for k, v in rank_environment(gloo, paths).items() if k.startswith("TORCH_")} == {
        "TORCH_FR_BUFFER_SIZE": "20000"  # gloo records too; the dump on a timeout is NCCL's watchdog's
    }


def first_step(rank: int, counter: int, *, step: int = 3, steps: int = 0) -> str:
    """A beat of `rank` inside `step` of its job (a resume from step 3), with `steps` finished in it."""
    return beat(rank, counter=counter, step=step, steps=steps)


def test_a_rank_in_its_first_step_is_judged_by_the_start_allowance_not_the_hang_threshold(heartbeat):
    # The first step compiles, loads and warms up: until a rank says it finished one (its own count, which the old
    # watcher guessed from the first step it happened to sample), the hang threshold does not judge it, but
    # resilience.start_s from the heartbeat's start does (the old watcher judged no rank before its first step).
    beat_ = heartbeat(2, hang_detect_s=1, heartbeat_s=0.1, start_s=2.5)
    store = beat_.store.store
    store.multi_set([beat_key(0), beat_key(1)], [first_step(r, 1) for r in (0, 1)])
    assert beat_.watch() is None
    time.sleep(1.2)  # past the hang threshold, within the allowance: the first step may take this long
    store.multi_set([beat_key(0), beat_key(1)], [first_step(0, 2, step=4, steps=1), first_step(1, 2)])
    assert beat_.watch() is None
    time.sleep(1.5)  # rank 1 beats on but never finishes its first step
    store.multi_set([beat_key(0), beat_key(1)], [first_step(0, 3, step=5, steps=2), first_step(1, 3)])
    report = beat_.watch()
    assert report is not None and report.rank == 1 and report.alive and report.limit == "resilience.start_s"
    assert report.line().startswith("rank 1 on host node0 made no progress for 3 s (its last beat: step 3, compute)")
    assert (
        "past resilience.start_s (2 s: a stuck main thread: it alone had not finished its first step)" in report.line()
    )


def test_ranks_that_all_stall_before_their_first_step_are_a_hang_that_blames_nobody(heartbeat):
    # Issue 43, case 3: fault.mtbf_s=1e-9 span every rank's loop before step 1; they beat on, enter no collective.
    beat_ = heartbeat(2, hang_detect_s=1, heartbeat_s=0.1, start_s=1)
    store = beat_.store.store
    for counter in range(3):
        store.multi_set([beat_key(0), beat_key(1)], [first_step(r, counter) for r in (0, 1)])
        assert beat_.watch() is None
        time.sleep(0.3)
    time.sleep(0.2)
    store.multi_set([beat_key(0), beat_key(1)], [first_step(r, 9) for r in (0, 1)])
    report = beat_.watch()
    assert report is not None and report.rank is None and report.limit == "resilience.start_s"
    assert report.line().startswith("every rank made no progress for 1 s (step 3), past resilience.start_s (1 s)")


def test_the_stacks_watchdog_cannot_fire_between_healthy_beats_but_fires_for_a_silent_one(heartbeat, tmp_path):
    """Issue 43, case 2: armed with the threshold alone and re-armed once a beat, it fired between beats late by less
    than one (and its walk of running threads crashed healthy ranks with SIGSEGV)."""
    beat_ = heartbeat(1, hang_detect_s=0.3, heartbeat_s=0.1)
    stacks = stacks_path(JobPaths(tmp_path, job_id="1"), 0)
    try:
        for _ in range(5):  # each beat a whole period late: the threshold and one period apart
            beat_.publish()
            time.sleep(beat_.threshold_s + beat_.period_s)
        assert stacks.read_text() == ""
        time.sleep(beat_.threshold_s + 3 * beat_.period_s)  # no beat at all: the dump comes
        assert stacks.read_text().startswith("Timeout")
    finally:
        beat_.watchdog.close()


@pytest.mark.parametrize(("given", "fix"), [("resilience.heartbeat_s=2", 0), ("resilience.heartbeat_s=5", 1)])
def test_a_hang_threshold_within_three_beats_is_refused_and_each_fix_composes(given, fix):
    """hang_detect_s=1 with heartbeat_s=2 was accepted, and crashed healthy ranks; both fixes the line gives work."""
    with pytest.raises(ConfigError) as err:
        compose("train_segment", ["resilience.hang_detect_s=1", given])
    line = str(err.value)
    assert f"resilience.hang_detect_s(1) < 3 x {given.replace('=', '(')})" in line and "\n" not in line
    fixes = re.findall(r"(?:raise|lower) (resilience\.\w+) to ([\d.e-]+)", line)
    assert len(fixes) == 2
    key, value = fixes[fix]
    compose("train_segment", ["resilience.hang_detect_s=1", given, f"{key}={value}"])
