"""Every reader of a run folder opens regular files only, bounded in size and depth, and ends in one line (issue 43,
case 6): a FIFO (opened without waiting for a writer), /dev/zero, a folder or a symlink loop where a document,
journal or power trace should be, through the export and report commands and the readers they share with status and
plan --from-run (their own hostile folders: tests/unit/test_status.py, test_plan_from_run.py). The export's
--max-shard-gb takes a finite number above 0 only."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.conftest import make_config
from trainflow.energy.phases import read_trace
from trainflow.export.__main__ import main as export_main
from trainflow.journal import Journal
from trainflow.records import RecordError, read_file, read_record
from trainflow.stages import report
from trainflow.train.step_log import StepRecord
from trainflow.train.summary import SegmentSummary

NOT_A_FILE = {
    "fifo": (os.mkfifo, "is a FIFO, not a regular file"),
    "dev-zero": (lambda p: p.symlink_to("/dev/zero"), "is a device or socket, not a regular file"),
    "folder": (os.mkdir, "is a folder, not a regular file"),
    "symlink-loop": (lambda p: p.symlink_to(p), "cannot be opened (Too many levels of symbolic links)"),
}


@pytest.mark.parametrize("case", NOT_A_FILE)
def test_a_document_a_journal_and_a_power_trace_that_are_no_file_are_one_line(tmp_path, case):
    make, words = NOT_A_FILE[case]
    for path, read in (
        (tmp_path / "segment-0.json", lambda p: read_record(SegmentSummary, p, rerun="train_segment")),
        (tmp_path / "steps.jsonl", lambda p: Journal(p, StepRecord).read()),
        (tmp_path / "segment-0-node1.jsonl", read_trace),
    ):
        make(path)
        started = time.monotonic()
        with pytest.raises(RecordError) as err:
            read(path)
        assert time.monotonic() - started < 1 and f"{path} {words}" in str(err.value) and "\n" not in str(err.value)


def test_sizes_and_depths_are_bounded(tmp_path):
    big = tmp_path / "big.json"
    big.write_text(" " * 2000)
    with pytest.raises(RecordError, match=r"big\.json holds more than 1000 bytes, more than trainflow writes there"):
        read_file(big, fix="rerun it", limit=1000)
    steps = tmp_path / "steps.jsonl"
    steps.write_text(
        json.dumps(StepRecord(0, 0.0, 5.0, 1e-3, 1.0, 0.1, 9.0, 0.1, 1.0, 0.1, 0.1, 0.0, 0.0, 0.0).to_json())
    )
    steps.write_text(steps.read_text() + "\n" + "[" * 100_000 + "]" * 100_000 + "\n")
    with pytest.raises(RecordError, match=r"steps\.jsonl:2 is not a JSON line \(RecursionError\)"):
        Journal(steps, StepRecord).read()
    trace = tmp_path / "segment-0-node1.jsonl"
    trace.write_text('{"since": 1.0, "t": 2.0}\n{"t": 3.0}\n')
    with pytest.raises(RecordError, match=r"segment-0-node1\.jsonl:2 is no power sample \(KeyError\)"):
        read_trace(trace)


def test_the_report_stage_on_a_fifo_summary_ends_in_one_line_at_once(tmp_path):
    fifo = tmp_path / "segment-0.json"
    os.mkfifo(fifo)
    cfg = make_config("report", tmp_path, f"io.segment_reports=[{fifo}]")
    with pytest.raises(RecordError) as err:
        report.run(cfg)
    assert str(err.value).startswith(f"{fifo} is a FIFO, not a regular file; rerun train_segment")


def test_export_refuses_a_shard_size_that_is_no_positive_number_in_one_line(tmp_path, capsys):
    """nan and inf ended in 9-line tracebacks; 0 and -1 were taken."""
    for value in ("nan", "inf", "0", "-1", "five"):
        with pytest.raises(SystemExit) as exit_:
            export_main(["--max-shard-gb", value, str(tmp_path), str(tmp_path / "out")])
        errors = [line for line in capsys.readouterr().err.splitlines() if "error:" in line]
        assert exit_.value.code == 2 and len(errors) == 1
        assert errors[0].endswith(f"--max-shard-gb({value}) must be a number of GB > 0, such as 5")
    assert not (tmp_path / "out").exists()


def fifo_manifest(root: Path) -> None:
    os.mkfifo(root / "ckpts/step-00000004/manifest.json")


def looping_out(root: Path) -> None:
    (root / "ckpts/step-00000004/manifest.json").write_text("{}")
    (root / "out").symlink_to(root / "out")


@pytest.mark.parametrize(
    ("hostile", "words"),
    [(fifo_manifest, "manifest.json is a FIFO, not a regular file"), (looping_out, "OUT(")],
    ids=["fifo-manifest", "looping-out"],
)
def test_export_of_a_hostile_folder_ends_in_one_line(tmp_path, hostile, words):
    (tmp_path / "ckpts/step-00000004").mkdir(parents=True)
    hostile(tmp_path)
    command = [sys.executable, "-m", "trainflow.export", str(tmp_path / "ckpts"), str(tmp_path / "out")]
    done = subprocess.run(command, capture_output=True, text=True, timeout=120)
    (line,) = [line for line in done.stderr.splitlines() if " ERROR " in line]
    assert done.returncode == 1 and "Traceback" not in done.stderr and words in line, done.stderr[-2000:]
