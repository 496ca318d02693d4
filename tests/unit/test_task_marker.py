"""A task's marker (launch.task.TaskMarker): written as the task starts and as its code ends, raising or not, and
read back with every field checked: an altered marker fails in one line naming the file and the field."""

from __future__ import annotations

import json
import types

import pytest
from submitit.core.utils import JobPaths

from trainflow.errors import TrainflowError
from trainflow.launch import task
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
