"""Typed records read back what they wrote, and a document that is not the record it should be (another version's,
an altered one) fails in one line naming the file, the field and the stage to rerun."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from enum import StrEnum

import pytest

from trainflow.config import ParallelDims
from trainflow.records import Record, RecordError, read_record


class Kind(StrEnum):
    PLAIN = "plain"
    FANCY = "fancy"


@dataclass(frozen=True)
class Inner(Record):
    name: str
    value: float | None


@dataclass(frozen=True)
class Outer(Record):
    layout: ParallelDims
    rows: list[Inner]
    table: dict[str, Inner]
    best: Inner | None = None
    tags: list[str] = field(default_factory=list)
    kind: Kind = Kind.PLAIN


SAMPLE = Outer(
    layout=ParallelDims(dp=2, tp=2, pp=1, world_size=4),
    rows=[Inner("a", 1.5), Inner("b", None)],
    table={"x": Inner("x", 3)},
    best=Inner("a", 1.5),
    kind=Kind.FANCY,
)


def test_a_record_reads_back_what_it_wrote(tmp_path):
    path = tmp_path / "outer.json"
    path.write_text(json.dumps(SAMPLE.to_json()))
    assert read_record(Outer, path) == SAMPLE
    assert json.loads(path.read_text())["kind"] == "fancy"  # an enum is written as its value
    assert read_record(Outer, path).kind is Kind.FANCY
    assert Outer.from_json({**SAMPLE.to_json(), "best": None, "tags": ["t"]}).best is None  # optional, defaulted


@pytest.mark.parametrize(
    ("change", "message"),
    [
        (lambda d: d.pop("rows"), r"outer\.json lacks Outer's field 'rows'"),
        (lambda d: d.update(planted=1), r"outer\.json holds 'planted', which Outer has no field for"),
        (lambda d: d["rows"][1].update(value="1"), r"outer\.json\.rows\[1\]\.value holds '1', not a float"),
        (lambda d: d.update(rows={"a": 1}), r"outer\.json\.rows holds dict, not a list"),
        (lambda d: d["layout"].update(world_size=3), r"dp\(2\) \* tp\(2\) \* pp\(1\) = 4 != world_size\(3\)"),
        (lambda d: d["table"].update(x=[1]), r"outer\.json\.table\.x holds list, not an object of Inner's fields"),
        (lambda d: d["layout"].update(dp=True), r"outer\.json\.layout\.dp holds True, not a int"),
        (lambda d: d.update(kind="odd"), r"outer\.json\.kind holds 'odd', not one of plain, fancy"),
        (lambda d: d.update(kind=["plain"]), r"outer\.json\.kind holds \['plain'\], not one of plain, fancy"),
    ],
)
def test_an_altered_document_is_one_line_naming_the_file_and_the_field(tmp_path, change, message):
    data = SAMPLE.to_json()
    change(data)
    path = tmp_path / "outer.json"
    path.write_text(json.dumps(data))
    with pytest.raises(RecordError, match=message) as err:
        read_record(Outer, path, rerun="the outer stage")
    assert "\n" not in str(err.value) and str(err.value).endswith("rerun the outer stage")


def test_a_missing_or_unreadable_file_names_the_stage_that_writes_it(tmp_path):
    with pytest.raises(RecordError, match=r"nothing\.json is missing: train_segment has not run"):
        read_record(Outer, tmp_path / "nothing.json", rerun="train_segment")
    (tmp_path / "bad.json").write_text('{"rows": [')
    with pytest.raises(RecordError, match=r"bad\.json is not readable JSON .*; rerun train_segment"):
        read_record(Outer, tmp_path / "bad.json", rerun="train_segment")
