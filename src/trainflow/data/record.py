"""The size and CRC-32C of a token file, recorded beside it when it is written and checked at every
copy and open, so a truncated or damaged file is named instead of read.

    <tokens.h5>.crc.json = {"bytes": n, "crc32c": c}

prepare_data records the capacity-tier file; stage_data checks it against the record before copying
and the copy after, and records the copy; the trainer compares the staged file's size with its record
when it opens it (a full CRC on every rank of a large job would read the whole file many times over).
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from trainflow.atomic import atomic_path, write_json
from trainflow.config import TrainflowError
from trainflow.crc import file_crc


class DataError(TrainflowError):
    """Input data that cannot be used."""


def record_path(tokens: str | Path) -> Path:
    return Path(f"{tokens}.crc.json")


def write_record(tokens: Path, size: int, crc: int) -> None:
    write_json(record_path(tokens), {"bytes": size, "crc32c": crc})


@contextmanager
def recorded(tokens: Path, *, expect: tuple[int, int] | None = None) -> Iterator[Path]:
    """A temporary path to write `tokens` through (atomic.atomic_path); when the block ends the file is
    checksummed (against `expect` if given: a mismatch raises and leaves `tokens` as it was) and
    renamed into place with its record. The old record goes first, so a crash in between leaves a file
    without a record (checks fail, naming the rerun), never a stale one."""
    with atomic_path(tokens) as tmp:
        yield tmp
        got = file_crc(tmp)
        if expect is not None and got != expect:
            raise DataError(
                f"{tmp} read back {got[0]} bytes with CRC-32C {got[1]:#010x}, expected {expect[0]} bytes with "
                f"{expect[1]:#010x}; check the file system of {tokens.parent} and rerun"
            )
        record_path(tokens).unlink(missing_ok=True)
    write_record(tokens, *got)


def read_record(tokens: Path, *, rerun: str) -> tuple[int, int]:
    """(bytes, CRC-32C) recorded for `tokens`; missing or unreadable, one DataError saying to rerun `rerun`."""
    path = record_path(tokens)
    try:
        record = json.loads(path.read_text())
        return int(record["bytes"]), int(record["crc32c"])
    except (OSError, ValueError, KeyError, TypeError) as err:
        raise DataError(
            f"{path} (the size and CRC of {tokens.name}) is missing or unreadable ({err}); rerun {rerun}"
        ) from err


def check_size(tokens: Path, *, rerun: str) -> None:
    """The cheap check of an open: the file's size against its record."""
    size, _ = read_record(tokens, rerun=rerun)
    if not tokens.is_file() or tokens.stat().st_size != size:
        found = tokens.stat().st_size if tokens.is_file() else "no"
        raise DataError(f"{tokens} holds {found} bytes but {size} were recorded; it is damaged: rerun {rerun}")
