"""fault.mtbf_s's arrival process (trainflow.resilience.arrivals): seeded, reproducible, at the configured rate and hang
share, and continued, not restarted, by every later job on the campaign's clock; found in O(1) per window from a job's
start however long the campaign has run, and a rate no job can meet refused at compose."""

from __future__ import annotations

import itertools
import time

import pytest

from tests.conftest import make_config
from trainflow.config import ConfigError, FaultConfig, compose
from trainflow.config.run_folder import RunFolder
from trainflow.errors import TrainflowError
from trainflow.journal import Journal
from trainflow.resilience.arrivals import Arrival, ArrivalKind, Arrivals, Process, clock, start_clock

PROCESS = {"mtbf_s": 30.0, "seed": 5, "hang_share": 0.4, "world": 4}


def first(n: int, **process: float) -> list[Arrival]:
    return list(itertools.islice(Process(started=1000.0, **{**PROCESS, **process}).after(1000.0), n))


def test_the_schedule_is_the_seeds_and_has_the_rate_and_the_share():
    arrivals = first(4000)
    assert arrivals[:50] == first(50)  # reproducible
    assert first(5, seed=6) != first(5)
    gaps = [b.time - a.time for a, b in itertools.pairwise([Arrival(1000.0, ArrivalKind.START), *arrivals])]
    assert all(g > 0 for g in gaps)
    assert sum(gaps) / len(gaps) == pytest.approx(30.0, rel=0.05)
    stalls = sum(a.kind is ArrivalKind.STALL for a in arrivals) / len(arrivals)
    assert stalls == pytest.approx(0.4, abs=0.03)
    assert {a.rank for a in arrivals} == {0, 1, 2, 3}


def job(tmp_path, rank: int, *, opens: float | None) -> Arrivals:
    return Arrivals(Process(started=1000.0, **PROCESS), rank, opens, tmp_path / "faults.jsonl", "h", 0)


def strikes(arrivals: Arrivals, times: list[float]) -> list[Arrival]:
    return [a for step, now in enumerate(times) if (a := arrivals.due(step, now)) is not None]


def test_each_rank_strikes_its_own_arrivals_once_and_a_restart_continues_the_process(tmp_path):
    planned = [a for a in first(40) if a.time < 1600]
    boundaries = [1000.0 + 0.5 * k for k in range(1201)]  # a step every half second, to t = 1600
    struck = [a for r in range(4) for a in strikes(job(tmp_path, r, opens=1000.0), boundaries)]
    assert [(a.time, a.kind, a.rank) for a in sorted(struck, key=lambda a: a.time)] == [
        (a.time, a.kind, a.rank) for a in planned
    ]
    # A restart whose processes started at t = 1300 meets the same process from there on, not a fresh one.
    later = [b for b in boundaries if b >= 1310]
    restarted = [a for r in range(4) for a in strikes(job(tmp_path, r, opens=1300.0), later)]
    assert sorted(a.time for a in restarted) == [a.time for a in planned if a.time >= 1300]
    assert len(Journal(tmp_path / "faults.jsonl", Arrival).read()) == len(struck) + len(restarted)


def test_a_first_job_is_at_risk_from_its_first_step(tmp_path):
    """A segment's first job (opens None) lets every arrival before its first step boundary pass: the planner's job
    starts are not at risk; a restart's are (opens: its process start)."""
    planned = first(40)
    boundary = planned[2].time + 0.1  # the first step boundary comes after three arrivals
    rank = planned[3].rank
    fresh = job(tmp_path, rank, opens=None)
    assert fresh.due(0, boundary) is None
    assert fresh.due(1, planned[3].time + 0.1).time == planned[3].time
    restart = job(tmp_path, planned[2].rank, opens=planned[2].time - 1)
    assert restart.due(0, boundary).time == planned[2].time


def test_the_clock_starts_once_per_settings_and_a_job_without_it_stops(tmp_path):
    ledger = tmp_path / "faults.jsonl"
    started = start_clock(ledger, mtbf_s=30.0, seed=5, hang_share=0.4)
    assert start_clock(ledger, mtbf_s=30.0, seed=5, hang_share=0.4) == started  # a later segment continues it
    assert clock(ledger, mtbf_s=60.0, seed=5) is None
    fault = FaultConfig(mtbf_s=60.0, seed=5)
    with pytest.raises(TrainflowError, match="no START line for fault.mtbf_s=60 fault.seed=5"):
        Arrivals.for_job(fault, ledger=ledger, rank=0, world=2, attempt=0, segment=0)
    assert Arrivals.for_job(FaultConfig(), ledger=ledger, rank=0, world=2, attempt=0, segment=0) is None
    arrivals = Arrivals.for_job(FaultConfig(mtbf_s=30.0, seed=5), ledger=ledger, rank=0, world=2, attempt=1, segment=0)
    assert arrivals.opens is not None and arrivals.opens <= started + 1


def test_the_rate_is_in_no_hash(tmp_path):
    """fault.mtbf_s and fault.seed change no checkpoint series: a drill and its rerun without it share one."""
    plain = make_config("train_segment", tmp_path)
    drill = make_config("train_segment", tmp_path, "fault.mtbf_s=30", "fault.seed=2")
    assert (drill.fault.mtbf_s, drill.fault.seed) == (30.0, 2)
    assert RunFolder.of(drill).series == RunFolder.of(plain).series


def test_a_job_finds_its_arrivals_in_o1_per_window_however_long_the_campaign_ran(tmp_path):
    """Issue 43, case 3: each job drew every gap since the campaign's start, one draw per arrival (at
    fault.mtbf_s=1e-9 it spun for ever before step 1). A job a year of 1-second windows into a campaign looks at its
    own windows only, and meets the arrivals a job from the start would have met there."""
    year = 365 * 86400.0
    process = Process(started=1000.0, mtbf_s=1.0, seed=5, hang_share=0.4, world=4)
    started = time.monotonic()
    late = list(itertools.islice(process.after(1000.0 + year), 50))
    assert time.monotonic() - started < 1.0
    assert all(a.time >= 1000.0 + year for a in late) and late == sorted(late, key=lambda a: a.time)
    window = int(year)  # the same windows, reached from earlier: the process does not depend on where one looks
    earlier = [a for k in range(window - 2, window + 60) for a in process.window(k) if a.time >= 1000.0 + year]
    assert late == earlier[:50]
    arrivals = Arrivals(process, late[0].rank, 1000.0 + year, tmp_path / "faults.jsonl", "h", 0)
    assert arrivals.due(0, late[0].time + 0.01).time == late[0].time


@pytest.mark.parametrize("mtbf", ["1e-9", "0.5"])
def test_a_rate_no_job_can_meet_is_refused_and_its_fixes_compose(mtbf):
    with pytest.raises(ConfigError) as err:
        compose("train_segment", [f"fault.mtbf_s={mtbf}"])
    line = str(err.value)
    assert f"fault.mtbf_s({float(mtbf):g}) is no failure rate a job can meet" in line and "\n" not in line
    for fix in ("fault.mtbf_s=1", "fault.mtbf_s=0"):
        assert fix in line
        compose("train_segment", [fix])
