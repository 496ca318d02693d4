"""A task's marker (launch.task.TaskMarker): written as the task starts and as its code ends, raising or not, and
read back with every field checked: an altered marker fails in one line naming the file and the field."""

from __future__ import annotations

import dataclasses
import json
import time
import types

import pytest
from submitit.core.utils import JobPaths

from trainflow.config.startup import StartupPart
from trainflow.errors import TrainflowError
from trainflow.launch import task
from trainflow.launch.restart import startup_parts
from trainflow.launch.task import TaskMarker, marked_task, read_marker, task_marker
from trainflow.records import RecordError


@pytest.fixture
def paths(tmp_path, monkeypatch):
    paths = JobPaths(tmp_path, job_id="7", task_id=1)
    env = types.SimpleNamespace(global_rank=1, paths=paths)
    monkeypatch.setattr(task.submitit, "JobEnvironment", lambda: env)
    return paths


def test_a_task_that_returns_marks_its_end(paths):
    with marked_task() as notes:
        started = read_marker(task_marker(paths))
        assert started.rank == 1 and started.ended is None and notes.step is None
    ended = read_marker(task_marker(paths))
    assert ended.ended >= ended.started and ended.error is None and not ended.expected


def test_a_task_that_raises_marks_the_error_and_the_step(paths):
    with pytest.raises(TrainflowError), marked_task() as notes:
        notes.step = 12
        raise TrainflowError("bad input")
    marker = read_marker(task_marker(paths))
    assert (marker.error, marker.expected, marker.step) == ("TrainflowError", True, 12) and marker.ended is not None
    with pytest.raises(ZeroDivisionError), marked_task():
        raise ZeroDivisionError("division by zero")
    assert read_marker(task_marker(paths)).expected is False


GOOD = TaskMarker(rank=0, host="nid001", pid=42, started=1.0, ended=2.0)


@pytest.mark.parametrize(
    ("change", "message"),
    [
        (lambda d: d.update(rank="0"), r"task\.json\.rank holds '0', not a int"),
        (lambda d: d.pop("host"), r"task\.json lacks TaskMarker's field 'host'"),
        (lambda d: d.update(shell="id"), r"task\.json holds 'shell', which TaskMarker has no field for"),
        (lambda d: d.update(ended="soon"), r"task\.json\.ended holds 'soon', not a float"),
    ],
)
def test_an_altered_marker_is_one_line_naming_the_file_and_the_field(tmp_path, change, message):
    data = GOOD.to_json()
    change(data)
    path = tmp_path / "7_0_task.json"
    path.write_text(json.dumps(data))
    with pytest.raises(RecordError, match=message) as err:
        read_marker(path)
    assert "\n" not in str(err.value)


def test_a_task_records_its_start_up_parts_in_order_and_a_failed_record_stops_nothing(paths):
    with marked_task():
        task.mark_part(paths, StartupPart.RENDEZVOUS)
        task.mark_first_step(paths)
        task_marker(paths).unlink()  # a marker gone (a full disk, an operator): the next part is left out, no raise
        task.mark_part(paths, StartupPart.BUILD)
        task_marker(paths).write_text(json.dumps(GOOD.to_json()))
        task.mark_part(paths, StartupPart.LOAD)
    marker = read_marker(task_marker(paths))
    assert list(marker.parts) == ["load"]  # the marker written in the block is the one its end reads
    with marked_task():
        task.mark_part(paths, StartupPart.RENDEZVOUS)
        task.mark_first_step(paths)
    marker = read_marker(task_marker(paths))
    assert set(marker.parts) == {"launch", "imports", "rendezvous"}  # /proc says when the process started
    assert marker.parts["launch"] <= marker.started == marker.parts["imports"] <= marker.parts["rendezvous"]
    assert marker.parts["rendezvous"] <= marker.first_step


def test_the_process_start_is_before_its_code_ran():
    started = task.process_start()
    assert started is not None and time.time() - 3600 * 24 < started <= time.time()


def test_a_marker_written_before_parts_still_reads(tmp_path):
    """Format 1 (no format key, no parts): the marker of a job a trainflow before the start-up's parts ran."""
    data = GOOD.to_json()
    del data["format"], data["parts"]
    path = tmp_path / "7_0_task.json"
    path.write_text(json.dumps(data))
    assert read_marker(path) == GOOD and read_marker(path).parts == {}


def test_the_ledger_takes_each_part_from_its_last_rank_from_the_jobs_asking():
    """launch.restart.startup_parts: a part ends when its last rank ends it; a part no rank recorded leaves its time
    to the next; the first is from the job step asked for."""
    a = dataclasses.replace(
        GOOD, parts={"launch": 11.0, "imports": 14.0, "rendezvous": 15.0, "load": 18.0}, first_step=19.0
    )
    b = dataclasses.replace(GOOD, rank=1, parts={"launch": 12.0, "imports": 13.0, "rendezvous": 15.5}, first_step=19.5)
    parts = startup_parts([a, b], submitted=10.0)
    assert parts == {"launch": 2.0, "imports": 2.0, "rendezvous": 1.5, "load": 2.5, "first_step": 1.5}
    assert startup_parts([GOOD], submitted=0.5) == {}  # a marker before parts: nothing to say
