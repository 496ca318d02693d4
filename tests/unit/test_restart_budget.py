"""The run's jobs ledger decides the restart budget and the hosts left out: restarts count only in a row without a
newer checkpoint, a completed job resets them, and every host a failure blamed stays out until Slurm shows it repaired
(resilience.ledger.standing; tests/unit/test_probation.py), up to resilience.max_excluded_nodes at once."""

from __future__ import annotations

import pytest

from trainflow.resilience.ledger import HostError, JobOutcome, JobRun, over_cap, standing


def job(n: int, outcome: str, checkpoint: int, *left_out: str, segment: int = 0) -> JobRun:
    return JobRun(
        segment=segment,
        attempt=n,
        job_id=str(n),
        submitted=0.0,
        started=0.0,
        ended=1.0,
        outcome=JobOutcome(outcome),
        left_out=list(left_out),
        checkpoint=checkpoint,
    )


def test_restarts_count_only_in_a_row_without_a_newer_checkpoint():
    assert standing([]).without_progress == 0
    # each failure came after a newer checkpoint: every restart is the first of its streak
    assert standing([job(0, "died", 2), job(1, "died", 4), job(2, "hang", 6)]).without_progress == 0
    # three failures at the same checkpoint: two restarts without progress already made
    assert standing([job(0, "died", 4), job(1, "died", 4), job(2, "died", 4)]).without_progress == 2
    # a completed job (the segment's end) resets the count, across segments
    assert standing([job(0, "died", 4), job(1, "died", 4), job(2, "completed", 6)]).without_progress == 0
    ledger = [job(0, "died", 4), job(1, "completed", 6), job(2, "died", 6, segment=1), job(3, "died", 6, segment=1)]
    assert standing(ledger).without_progress == 1


def test_every_blamed_host_stays_out_without_slurm_s_word_and_the_cap_stops_it(tmp_path):
    ledger = [job(0, "died", 2, "nid001"), job(1, "completed", 6), job(2, "hang", 8, "nid007", segment=1)]
    assert {host: p.job for host, p in standing(ledger).excluded.items()} == {"nid001": "job 0", "nid007": "job 2"}
    assert over_cap(frozenset(standing(ledger).excluded), 2, tmp_path / "jobs.jsonl") is None
    line = over_cap(frozenset(standing(ledger).excluded) | {"nid009"}, 2, tmp_path / "jobs.jsonl")
    assert line.startswith("the run leaves out 3 hosts at once (nid001, nid007, nid009), past resilience.max_excluded")
    assert "\n" not in line


def test_a_hostile_host_in_the_ledger_is_refused_in_one_line():
    with pytest.raises(HostError, match=r"jobs ledger's job 0 names the host 'nid001;touch /tmp/x' to leave out"):
        standing([job(0, "died", 2, "nid001;touch /tmp/x")])
