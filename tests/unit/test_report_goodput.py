"""The report's goodput section (report.goodput): each segment's terms, the failed jobs and their verdicts, every
loss-guard event, and the ranks' forward times with the stragglers flagged."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

from trainflow.report.goodput import SLOWEST, goodput_section
from trainflow.resilience.goodput import Span, measure_goodput
from trainflow.resilience.ledger import JobRun
from trainflow.resilience.timing import RankTiming
from trainflow.train.guard import GuardEvent


def segment(index: int, *, failed: bool, ranks: list[RankTiming], guard: list[GuardEvent]) -> SimpleNamespace:
    """What the section reads of a SegmentSummary."""
    jobs = [JobRun(index, 0, "11", 0.0, 1.0, 10.0, "completed")]
    if failed:
        died = JobRun(
            index, 0, "10", 0.0, 1.0, 5.0, "died", "rank 1 on host n2 was killed by SIGKILL", "restart 1 of 3"
        )
        jobs = [died, JobRun(index, 1, "11", 6.0, 7.0, 10.0, "completed")]
    spans = [Span(index, "step", 0, 2.0, 2.0), Span(index, "step", 0, 7.5, 2.0)]
    return SimpleNamespace(segment=index, goodput=measure_goodput(jobs, spans), guard=guard, ranks=ranks)


def test_the_section_holds_every_term_the_failures_the_guard_and_the_stragglers():
    ranks = [RankTiming(r, f"n{r // 4}", 0.050 + (0.05 if r == 6 else 0.0), 30) for r in range(8)]
    skip = GuardEvent(step=7, action="skipped", reason="loss nan", windows=[[56, 64]])
    segments = [segment(0, failed=False, ranks=[], guard=[]), segment(1, failed=True, ranks=ranks, guard=[skip])]
    text = "\n".join(goodput_section(segments, "/r/report/goodput.png", Path("/r/report"), straggler_factor=1.5))
    assert "| segment | wall s | goodput | jobs | productive |" in text and "![goodput](goodput.png)" in text
    assert "| 1 | 10.0 | 20.0% | 2 |" in text  # step 0's second run is kept: 2 s of 10
    assert "| 1 | 0 | 10 | died | rank 1 on host n2 was killed by SIGKILL | restart 1 of 3 | job |  |" in text
    assert "- segment 1, step 7: not applied (loss nan; samples 56-63)" in text
    assert "| n0 | 4 | 50.0 |" in text and "| n1 | 4 | 50.0 |" in text  # per-host medians
    assert "Stragglers (median forward above 1.5 x the median over ranks): rank 6 on n1 (100.0 ms)" in text
    assert text.index("| 6 | n1 | 100.0 | 30 |") < text.index("| 0 | n0 | 50.0 | 30 |")  # slowest first


def test_a_large_job_shows_only_its_slowest_ranks():
    ranks = [RankTiming(r, f"n{r // 4}", 0.05, 30) for r in range(4096)]
    text = "\n".join(
        goodput_section([segment(0, failed=False, ranks=ranks, guard=[])], "g.png", Path("."), straggler_factor=1.5)
    )
    assert f"Per rank (the {SLOWEST} slowest of 4096):" in text
    assert "No rank's median forward exceeds 1.5 x the median over ranks" in text


def test_a_failure_recovered_from_peers_shows_its_way_and_its_time_to_the_next_step():
    died = JobRun(0, 0, "9.0", 0.0, 1.0, 5.0, "died", "rank 1 on host n2 was killed by SIGKILL", "recovered from peers")
    on = JobRun(0, 0, "9.0", 5.5, 5.5, 10.0, "completed", generation=1, recovery="peers", first_step_s=2.5)
    spans = [Span(0, "step", 0, 2.0, 2.0), Span(0, "step", 1, 7.0, 2.0)]
    summary = SimpleNamespace(segment=0, goodput=measure_goodput([died, on], spans), guard=[], ranks=[])
    text = "\n".join(goodput_section([summary], "g.png", Path("."), straggler_factor=1.5))
    assert "| failure | verdict | recovery | to first step (s) |" in text
    assert "| recovered from peers | peers | 2.5 |" in text
