"""Typed records of the JSON documents stages hand each other (the step log, a segment's summary, nccl.json,
energy.json): frozen dataclasses, each beside its writer, read back by `from_json` into the same types.

    python -c "from trainflow.records import read_record; from trainflow.gate.report import NcclReport; \
        print(read_record(NcclReport, 'runs/default/nccl.json').world_size)"

A document is JSON on disk, keyed by the fields' names (docs/runs.md lists them), so other tools read it without
trainflow. `from_json` rebuilds nested records from the field types (a record, a list or dict of them, an enum from
its value, or None); written by hand because the standard library has no inverse of dataclasses.asdict, and one small
function keeps the records free of a dependency. A document written by another trainflow version, or altered, fails
in one line naming the file, the missing or unexpected field and the stage to rerun: these files may be hostile, so
nothing in them is trusted to have the right shape.
"""

from __future__ import annotations

import dataclasses
import enum
import json
import types
import typing
from pathlib import Path
from typing import Any, TypeVar

from trainflow.errors import TrainflowError

R = TypeVar("R", bound="Record")


class RecordError(TrainflowError):
    """A document that does not hold the record it should."""


class Record:
    """Base of the typed records: `to_json` writes the fields, `from_json` reads them back."""

    def to_json(self) -> dict:
        return dataclasses.asdict(self)  # type: ignore[call-overload]

    @classmethod
    def from_json(cls: type[R], data: object, *, where: str = "") -> R:
        return _build(cls, data, where or cls.__name__)


def read_record(cls: type[R], path: str | Path, *, rerun: str = "the stage that writes it") -> R:
    """The record in the JSON file `path`; one RecordError naming the file and `rerun` if it is not one."""
    path = Path(path)
    try:
        data = json.loads(path.read_text())
    except FileNotFoundError:
        raise RecordError(f"{path} is missing: {rerun} has not run; run the whole DAG or force that stage") from None
    except (OSError, ValueError) as err:
        raise RecordError(f"{path} is not readable JSON ({err}); rerun {rerun}") from err
    try:
        return cls.from_json(data, where=str(path))
    except RecordError as err:
        raise RecordError(f"{err}; it was written by another trainflow version or altered: rerun {rerun}") from None


def _build(kind: Any, data: object, where: str) -> Any:
    origin, args = typing.get_origin(kind), typing.get_args(kind)
    if origin in (typing.Union, types.UnionType):
        if data is None and type(None) in args:
            return None
        kinds = [a for a in args if a is not type(None)]
        for inner in kinds[:-1]:  # float | str: the first the value is
            try:
                return _build(inner, data, where)
            except RecordError:
                continue
        return _build(kinds[-1], data, where)
    if isinstance(kind, type) and issubclass(kind, Record):
        if not isinstance(data, dict):
            raise RecordError(f"{where} holds {type(data).__name__}, not an object of {kind.__name__}'s fields")
        hints = typing.get_type_hints(kind)
        fields = {f.name: f for f in dataclasses.fields(kind)}  # type: ignore[arg-type]
        if extra := sorted(set(data) - set(fields)):
            raise RecordError(f"{where} holds {extra[0]!r}, which {kind.__name__} has no field for")
        values = {}
        for name, f in fields.items():
            if name in data:
                values[name] = _build(hints[name], data[name], f"{where}.{name}")
            elif f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING:
                raise RecordError(f"{where} lacks {kind.__name__}'s field {name!r}")
        try:
            return kind(**values)
        except TrainflowError as err:  # a record that checks itself (config.layout.ParallelDims)
            raise RecordError(f"{where}: {err}") from None
    if origin is list and isinstance(data, list):
        return [_build(args[0], item, f"{where}[{i}]") for i, item in enumerate(data)]
    if origin is dict and isinstance(data, dict):
        return {k: _build(args[1], v, f"{where}.{k}") for k, v in data.items()}
    if origin in (list, dict):
        raise RecordError(f"{where} holds {type(data).__name__}, not a {origin.__name__}")
    if isinstance(kind, type) and issubclass(kind, enum.Enum):  # a kind or outcome: written as its value
        try:
            return kind(data)
        except (ValueError, TypeError):
            raise RecordError(f"{where} holds {data!r}, not one of {', '.join(str(m.value) for m in kind)}") from None
    if kind in SCALARS and type(data) not in SCALARS[kind]:  # bool is an int to isinstance, not to a record
        raise RecordError(f"{where} holds {data!r}, not a {kind.__name__}")
    return data


SCALARS = {float: (float, int), int: (int,), str: (str,), bool: (bool,)}
"""A scalar field's type -> the Python types json.loads gives for it (a float field may hold an integral number)."""
