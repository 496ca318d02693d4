"""Atomic writes: a temporary file beside the target, fsynced, renamed into place, the folder fsynced,
so a reader (or a crash) sees the old file or the new one, never half of one. Every JSON, markdown,
PNG and token file trainflow writes goes through here.

    python -c "from trainflow.atomic import write_json; write_json('/tmp/x.json', {'a': 1})"
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path


def fsync_path(path: str | Path) -> None:
    """fsync a file or a folder (a rename is durable only once its folder is)."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


@contextmanager
def atomic_path(path: str | Path) -> Iterator[Path]:
    """A temporary path to write `path` through: when the block ends it is fsynced and renamed into
    place; when the block raises it is removed and `path` is left as it was. The temporary name holds the process's
    id, so processes writing the same file at once (the evaluate jobs' corpus task) never write through one file."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f"{path.name}.{os.getpid()}.tmp")
    try:
        yield tmp
        fsync_path(tmp)
        os.replace(tmp, path)
        fsync_path(path.parent)
    finally:
        tmp.unlink(missing_ok=True)


def write_text_atomic(path: str | Path, text: str) -> None:
    with atomic_path(path) as tmp:
        tmp.write_text(text)


def write_json(path: str | Path, obj: object) -> None:
    write_text_atomic(path, json.dumps(obj, indent=2, sort_keys=True) + "\n")
