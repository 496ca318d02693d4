"""A checkpoint file read whole into memory, its size and CRC-32C checked against the manifest as it is read: how
each rank of a single read (checkpoint.single_read) reads its share.

    python -m pytest tests/unit/test_single_read.py -k damaged
"""

from __future__ import annotations

import os
from pathlib import Path

import crc32c
import torch
import torch.distributed as dist

from trainflow.checkpoint.manifest import FALLS_BACK, ChecksumError, FileEntry
from trainflow.crc import BLOCK


class CorruptFileError(ChecksumError):
    """A checkpoint file whose size or CRC-32C is not its manifest's: the load falls back to an older checkpoint."""


def read_checked(
    path: Path, want: FileEntry | None, *, directory: Path, into: torch.Tensor | None = None
) -> torch.Tensor:
    """The whole file `path` as a uint8 tensor (`into` where given, of the manifest's size), its size and CRC-32C
    checked against the manifest's `want` as it is read; one CorruptFileError naming the file and the rank that read
    it otherwise."""
    size = path.stat().st_size
    data = torch.empty(size, dtype=torch.uint8) if into is None or into.numel() != size else into
    view, crc, done = memoryview(data.numpy()), 0, 0
    with open(path, "rb", buffering=0) as f:
        os.posix_fadvise(f.fileno(), 0, 0, os.POSIX_FADV_SEQUENTIAL)
        while done < size and (n := f.readinto(view[done : done + BLOCK])):
            crc, done = crc32c.crc32c(view[done : done + n], crc), done + n
    if want is None or (done, crc) != (want.bytes, want.crc32c):
        said = f"{want.bytes} bytes with {want.crc32c:#010x}" if want else "nothing (it is not listed)"
        raise CorruptFileError(
            f"{path} (read by rank {dist.get_rank()}): {done} bytes with CRC-32C {crc:#010x}, manifest says {said}; "
            f"the file is corrupt, delete "
            f"{directory} ({FALLS_BACK})"
        )
    return data
