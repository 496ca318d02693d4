"""The plan from a run's own terms (plan.from_run, train.run_terms): a campaign's measured terms put through the
planner's simulation; `python -m trainflow.plan --from-run` on a hostile run folder."""

from __future__ import annotations

import dataclasses
import json
import os
from pathlib import Path
from types import SimpleNamespace

import pytest

from trainflow.plan.__main__ import main
from trainflow.plan.from_run import TERMS, plan_run, read_terms
from trainflow.report.goodput import goodput_section
from trainflow.resilience.goodput import Span, measure_goodput
from trainflow.resilience.ledger import JobRun
from trainflow.train.run_terms import run_terms

STEP, SAVE, EVERY = 1.0, 0.5, 4


def job_spans(segment: int, start: float, steps: range) -> tuple[list[Span], float]:
    """A job's spans from `start`: a 2 s load, then its steps, a save after every EVERY of them."""
    spans, t = [Span(segment, "load", steps[0], start, 2.0)], start + 2.0
    for step in steps:
        spans.append(Span(segment, "step", step, t, STEP))
        t += STEP
        if (step + 1) % EVERY == 0:
            spans.append(Span(segment, "save", step + 1, t, SAVE))
            t += SAVE
    return spans, t


def segment(index: int, jobs: list[JobRun], spans: list[Span]) -> SimpleNamespace:
    """What run_terms and the report's goodput section read of a SegmentSummary."""
    setup = SimpleNamespace(checkpoint_interval=SimpleNamespace(interval_steps=EVERY))
    goodput = measure_goodput(jobs, spans)
    return SimpleNamespace(segment=index, goodput=goodput, setup=setup, saves=[], guard=[], ranks=[])


def campaign() -> tuple[list[SimpleNamespace], list[Span]]:
    """Two segments of 16 steps; segment 1's first job dies after step 21 (two steps past its checkpoint at 20) and a
    restart 4 s later (1 s queue, 3 s start-up before its load) redoes steps 20-21."""
    first, end0 = job_spans(0, 11.0, range(16))
    jobs0 = [JobRun(0, 0, "1", 10.0, 11.0, end0 + 1.0, "completed")]
    died, fail = job_spans(1, end0 + 3.0, range(16, 22))
    jobs1 = [JobRun(1, 0, "2", end0 + 2.0, end0 + 3.0, fail + 2.0, "died", "rank 1 killed")]
    redo, end1 = job_spans(1, fail + 2.0 + 4.0 + 3.0, range(20, 32))
    jobs1.append(JobRun(1, 1, "3", fail + 5.0, fail + 6.0, end1 + 1.0, "completed"))
    spans = first + died + redo
    return [segment(0, jobs0, spans), segment(1, jobs1, spans)], spans


def test_the_terms_split_a_campaign_as_measured_and_the_plan_holds_them():
    segments, spans = campaign()
    terms = run_terms(segments, spans, mtbf_s=100.0, hang_share=0.2)
    assert (terms.steps, terms.failures, terms.hangs, terms.segments) == (32, 1, 0, 2)
    assert terms.step_s == pytest.approx(STEP) and terms.blocking_s == pytest.approx(SAVE)
    assert terms.detect_s == pytest.approx(2.0)  # the died job's last span to its end
    assert terms.wait_s == pytest.approx(3.0 + 1.0) and terms.held_s == pytest.approx(
        3.0 + 2.0
    )  # gap+queue; start, load
    m = terms.measured
    assert m["lost work"] == pytest.approx(2 * STEP) and m["restart"] == pytest.approx(9.0)
    assert sum(m[k] for k in TERMS) + m["productive"] == pytest.approx(m["wall"])
    plan = plan_run(terms)
    assert plan.met.mtbf_s == pytest.approx(terms.at_risk_s) and plan.met.failures == pytest.approx(1, abs=0.6)
    assert plan.met.low <= plan.met.goodput <= plan.met.high
    assert plan.injected.mtbf_s == 100.0 and plan.injected.goodput > plan.met.goodput  # 100 s: fewer failures
    assert plan.met.seconds["productive"] == pytest.approx(m["productive"])
    for k in ("checkpoint", "start-up", "evaluation"):  # what failures do not change is planned as measured
        assert plan.met.seconds[k] == pytest.approx(m[k], abs=1e-6), k


def test_a_run_without_failures_is_planned_as_measured():
    segments, spans = campaign()
    terms = run_terms(segments[:1], spans, mtbf_s=0.0, hang_share=0.2)
    plan = plan_run(terms)
    assert plan.injected is None and plan.met.failures < 1e-9
    assert plan.met.goodput == pytest.approx(plan.measured, abs=1e-9) and plan.differs_most is None
    assert plan.met.seconds["wall"] == pytest.approx(terms.measured["wall"])


def write_terms(tmp_path, text: str):
    folder = tmp_path / "train/abc123"
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "terms.json").write_text(text)


def good_terms() -> dict:
    segments, spans = campaign()
    return run_terms(segments, spans, mtbf_s=100.0, hang_share=0.2).to_json()


def test_from_run_prints_the_plan_beside_the_measurement(tmp_path, capsys):
    write_terms(tmp_path, json.dumps(good_terms()))
    assert main(["--from-run", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert "measured goodput" in out and "at the injected fault.mtbf_s 100 s" in out and "lost work: planned" in out
    assert read_terms(tmp_path).failures == 1


@pytest.mark.parametrize(
    "text, message",
    [
        ("{not json", "terms.json is not readable JSON (JSONDecodeError"),
        ('{"segments": 2}', "does not read as a run's terms"),
        ("1" * 5000, "terms.json is not readable JSON (ValueError"),  # past Python's integer digits
        ("[" * 100_000 + "]" * 100_000, "terms.json is not readable JSON (RecursionError"),  # issue 43: 28 lines
        (json.dumps({**good_terms(), "step_s": 1e300}), "holds step_s=1e+300 (seconds from 0 to 1e+09)"),
        (json.dumps({**good_terms(), "mtbf_s": float("nan")}), "holds mtbf_s=nan"),
        (json.dumps({**good_terms(), "steps": 2**62}), "holds steps=4611686018427387904 (a count"),
        (json.dumps({**good_terms(), "eval_share": 3.0}), "holds eval_share=3.0 (a share"),
        (json.dumps({**good_terms(), "measured": {"wall": 1.0}}), "holds measured lacks a term"),
        (json.dumps({**good_terms(), "hangs": 5}), "holds hangs=5 > failures=1"),
        (" " * (2 << 20), "terms.json holds more than 1048576 bytes, more than trainflow writes there"),
    ],
)
def test_from_run_on_a_hostile_folder_is_one_line(tmp_path, capsys, text, message):
    write_terms(tmp_path, text)
    assert main(["--from-run", str(tmp_path)]) == 1
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and message in err, err


@pytest.mark.parametrize(
    ("make", "kind"),
    [
        (lambda p: p.symlink_to("/dev/zero"), "is a device or socket, not a regular file"),
        (os.mkfifo, "is a FIFO, not a regular file"),  # opened without waiting for a writer: no hang
        (lambda p: p.symlink_to(p), "holds no train/<series>/terms.json"),  # a loop is no file: glob passes it by
    ],
    ids=["dev-zero", "fifo", "symlink-loop"],
)
def test_from_run_reads_no_device_pipe_or_loop_behind_the_name(tmp_path, capsys, make, kind):
    folder = tmp_path / "train/abc123"
    folder.mkdir(parents=True)
    make(folder / "terms.json")
    assert main(["--from-run", str(tmp_path)]) == 1
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and kind in err, err


def test_from_run_without_terms_says_what_to_pass(tmp_path, capsys):
    assert main(["--from-run", str(tmp_path / "nowhere")]) == 1
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "holds no train/<series>/terms.json" in err


def test_the_report_sets_planned_beside_measured_and_names_the_term_outside_the_band():
    segments, spans = campaign()
    terms = run_terms(segments, spans, mtbf_s=100.0, hang_share=0.2)
    plan = plan_run(terms)
    text = "\n".join(goodput_section(segments, "g.png", Path("."), straggler_factor=1.5, planned=plan))
    assert "### Planned against measured" in text
    assert "| term (trainflow.badput) | planned | measured | difference | ml-goodput-measurement |" in text
    m = terms.measured
    restart = f"| restart | {plan.met.seconds['restart']:.1f} | {m['restart']:.1f} |"
    assert restart in text and "| INFRASTRUCTURE_RECOVERY_FROM_DISRUPTION + UNPRODUCTIVE_CHECKPOINT_" in text
    assert "At the injected fault.mtbf_s (100 s)" in text
    # A minute more detection than measured, the rest as planned: outside the band, detection the term that differs.
    slow = dataclasses.replace(terms, measured={**m, "detection": m["detection"] + 60, "wall": m["wall"] + 60})
    off = plan_run(slow)
    assert off.differs_most == "detection"
    text = "\n".join(goodput_section(segments, "g.png", Path("."), straggler_factor=1.5, planned=off))
    assert "lies outside the plan's 5-95 % band" in text and "detection differs most" in text


def test_overrides_beside_from_run_are_refused_not_dropped(tmp_path, capsys):
    """Issue 43, case 8: they were dropped without a word (a typo among them): the plan comes from the run's terms."""
    write_terms(tmp_path, json.dumps(good_terms()))
    assert main(["--from-run", str(tmp_path), "optim.lrr=1e-3", "fault.mtbf_s=50"]) == 1
    (line,) = capsys.readouterr().err.splitlines()
    assert line == (
        "trainflow.plan: --from-run plans from the run's measured terms and takes no overrides (given: optim.lrr=1e-3 "
        "fault.mtbf_s=50); drop them, or plan them without --from-run"
    )
    assert main(["--from-run", str(tmp_path)]) == 0  # the fix, followed
