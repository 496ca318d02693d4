"""Goodput, measured (resilience.goodput): a segment's wall time split by term from its jobs and rank 0's spans."""

from __future__ import annotations

import pytest

from trainflow.resilience.goodput import TERMS, Span, measure_goodput, segment_jobs
from trainflow.resilience.ledger import JobRun


def job(attempt: int, submitted: float, started: float, ended: float, outcome: str, segment: int = 0) -> JobRun:
    return JobRun(segment, attempt, str(100 + attempt), submitted, started, ended, outcome)


def steps(first: int, last: int, start: float, kind: str = "step") -> list[Span]:
    return [Span(0, kind, s, start + (s - first), 1.0) for s in range(first, last + 1)]


def test_a_failed_job_s_lost_steps_count_as_recomputed_and_its_tail_as_detection():
    # Job 0: queued 2 s, starts up 3 s, steps 0-3 (1 s each), saves at 2 (0.5 s, step 2 runs after it), dies in step
    # 4 and is seen ended 6 s after its last span. Job 1: submitted 1 s later, loads step 2, redoes 2-5.
    spans = [Span(0, "step", 0, 5.0, 1.0), Span(0, "step", 1, 6.0, 1.0), Span(0, "save", 2, 7.0, 0.5)]
    spans += [Span(0, "step", 2, 7.5, 1.0), Span(0, "step", 3, 8.5, 1.0)]
    spans += [Span(0, "load", 2, 21.0, 2.0), *steps(2, 5, 23.0), Span(0, "save", 6, 27.0, 0.5)]
    jobs = [job(0, 0.0, 2.0, 15.5, "died"), job(1, 16.5, 18.0, 28.0, "completed")]
    g = measure_goodput(jobs, spans)
    s = g.seconds
    assert g.wall_s == 28.0
    assert s["productive"] == 6.0 and s["recomputed"] == 2.0  # steps 0,1 and 2-5 kept; the first 2, 3 redone
    assert s["checkpoint"] == 1.0 and s["load"] == 2.0
    assert s["queue"] == 2.0 + 1.5 and s["start-up"] == 3.0 + 3.0  # 18 -> 21 before the load
    assert s["detection"] == 6.0 and s["shutdown"] == 0.5 and s["restart"] == 1.0
    assert s["other"] == 0.0 and g.unaccounted == pytest.approx(0.0)
    assert g.goodput == pytest.approx(6.0 / 28.0)
    assert set(s) == set(TERMS)


def test_guard_skipped_steps_and_evaluations_have_their_own_terms():
    spans = [Span(0, "eval", 0, 1.0, 0.5), *steps(0, 1, 1.5), Span(0, "skipped", 2, 3.5, 1.0), *steps(3, 3, 4.5)]
    g = measure_goodput([job(0, 0.0, 0.5, 6.0, "completed")], spans)
    assert g.seconds["evaluation"] == 0.5 and g.seconds["skipped"] == 1.0 and g.seconds["productive"] == 3.0
    assert g.seconds["start-up"] == 0.5 and g.seconds["shutdown"] == 0.5


def test_the_wall_time_covers_the_jobs_since_the_segment_last_completed():
    history = [job(0, 0, 1, 5, "completed"), job(0, 50, 51, 60, "died"), job(1, 70, 71, 90, "completed")]
    history.insert(1, job(0, 0, 1, 5, "completed", segment=1))
    assert [j.submitted for j in segment_jobs(history, 0)] == [50, 70]
    assert segment_jobs(history[:1], 0) == history[:1]


def test_a_step_s_bookkeeping_counts_with_it_and_a_gap_after_a_save_is_other():
    spans = [Span(0, "step", 0, 1.0, 1.0), Span(0, "save", 1, 2.25, 0.5), Span(0, "step", 1, 3.0, 1.0)]
    g = measure_goodput([job(0, 0.0, 0.0, 4.0, "completed")], spans)
    assert g.seconds["productive"] == 2.25 and g.seconds["checkpoint"] == 0.5  # 0.25 s of records after step 0
    assert g.seconds["other"] == 0.25 and g.seconds["start-up"] == 1.0 and g.unaccounted == 0.0
