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

Every document carries its record's format (`"format": n`, FORMAT; a document without one is format 1, as everything
trainflow wrote before formats was). A document whose fields change, its own or those of a record nested in it, takes
the next format and a migration from the one before (MIGRATIONS: format n's document -> format n + 1's), so a reader
upgrades an older document explicitly, step by step, and refuses a newer one in one line (NewerFormatError): a campaign
outlives the trainflow release that began it. Nested records carry no format of their own: their document's does.
"""

from __future__ import annotations

import dataclasses
import enum
import json
import os
import stat
import types
import typing
from collections.abc import Callable
from pathlib import Path
from typing import Any, ClassVar, TypeVar

from trainflow.errors import TrainflowError

R = TypeVar("R", bound="Record")


FORMAT_KEY = "format"
DOCUMENT_BYTES = 1 << 28
"""More than any document trainflow writes (a 4096-rank manifest is a few MB): a bigger one is not read."""
JOURNAL_BYTES = 1 << 31
"""More than any journal trainflow appends (a million steps' records are about 0.5 GB): a bigger one is not read."""


class RecordError(TrainflowError):
    """A document that does not hold the record it should."""


class NewerFormatError(RecordError):
    """A document in a format this trainflow does not read yet: written by a newer release."""


class Record:
    """Base of the typed records: `to_json` writes the fields and the format, `from_json` reads them back."""

    FORMAT: ClassVar[int] = 1
    """The format of the record's document: one more each time its fields change."""
    MIGRATIONS: ClassVar[dict[int, Callable[[dict], dict]]] = {}
    """Format n -> the function that rewrites a format-n document (without its format key) as format n + 1's."""

    def to_json(self) -> dict:
        """The document: the fields, and the format (only here: records nested in it are written without theirs)."""
        return {FORMAT_KEY: self.FORMAT, **dataclasses.asdict(self)}  # type: ignore[call-overload]

    @classmethod
    def from_json(cls: type[R], data: object, *, where: str = "") -> R:
        """The record a document holds, upgraded from its format first (the records nested in it are its own: a
        document's migrations rewrite them)."""
        where = where or cls.__name__
        return _build(cls, upgraded(cls, data, where) if isinstance(data, dict) else data, where)


def fields_added(data: dict) -> dict:
    """A migration to a format that only added fields with defaults: the older document reads as it is."""
    return data


def read_file(path: str | Path, *, fix: str, limit: int = DOCUMENT_BYTES) -> str:
    """The text of the regular file `path` (at most `limit` bytes); one RecordError naming it and ending in `fix` for
    anything else: a FIFO (opened without waiting for a writer), a device (/dev/zero would be read for ever), a folder,
    a symlink loop or an unreadable file. FileNotFoundError passes: whether a missing file is wrong is the caller's."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
    except FileNotFoundError:
        raise
    except OSError as err:  # ELOOP: a symlink loop; EACCES; ENXIO
        raise RecordError(f"{path} cannot be opened ({err.strerror}); {fix}") from None
    mode, size = os.fstat(fd).st_mode, os.fstat(fd).st_size
    if not stat.S_ISREG(mode):
        os.close(fd)
        kind = "a folder" if stat.S_ISDIR(mode) else "a FIFO" if stat.S_ISFIFO(mode) else "a device or socket"
        raise RecordError(f"{path} is {kind}, not a regular file; {fix}")
    with os.fdopen(fd, "rb") as f:
        data = f.read(min(size, limit) + 1)  # a byte past its size: a file that grew past the limit meanwhile
    if len(data) > limit:
        raise RecordError(f"{path} holds more than {limit} bytes, more than trainflow writes there; {fix}")
    return data.decode("utf-8", errors="replace")


def read_json(path: str | Path, *, fix: str, limit: int = DOCUMENT_BYTES) -> object:
    """The JSON document in the regular file `path`; one RecordError naming it and `fix` if it is none (nested past
    Python's recursion limit too: a bound on its depth)."""
    text = read_file(path, fix=fix, limit=limit)
    try:
        return json.loads(text)
    except (ValueError, RecursionError) as err:
        raise RecordError(f"{path} is not readable JSON ({type(err).__name__}: {str(err)[:200]}); {fix}") from None


def read_record(cls: type[R], path: str | Path, *, rerun: str = "the stage that writes it") -> R:
    """The record in the JSON file `path`; one RecordError naming the file and `rerun` if it is not one."""
    path = Path(path)
    try:
        data = read_json(path, fix=f"rerun {rerun}")
    except FileNotFoundError:
        raise RecordError(f"{path} is missing: {rerun} has not run; run the whole DAG or force that stage") from None
    try:
        return cls.from_json(data, where=str(path))
    except NewerFormatError:
        raise
    except RecordError as err:
        raise RecordError(f"{err}; it was written by another trainflow version or altered: rerun {rerun}") from None


def upgraded(kind: type[Record], data: dict, where: str) -> dict:
    """A document of `kind` without its format key, migrated from its format to kind.FORMAT; one NewerFormatError
    where it is newer than this trainflow reads."""
    data = dict(data)
    version = data.pop(FORMAT_KEY, 1)
    if type(version) is not int or version < 1:
        raise RecordError(f"{where} holds format {version!r}, not a format number (1, 2, ...)")
    if version > kind.FORMAT:
        raise NewerFormatError(
            f"{where} is {kind.__name__} format {version}, written by a newer trainflow than this one (which reads "
            f"formats up to {kind.FORMAT}): upgrade trainflow to read it; nothing was changed"
        )
    for step in range(version, kind.FORMAT):
        try:
            data = kind.MIGRATIONS[step](data)
        except (KeyError, TypeError, AttributeError, ValueError) as err:  # a hostile document: its fields' shapes
            raise RecordError(f"{where} is {kind.__name__} format {step} but does not read as one ({err!r})") from None
    return data


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
        if FORMAT_KEY in data:  # a record written as a document of its own (to_json) into another
            data = upgraded(kind, data, where)
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
