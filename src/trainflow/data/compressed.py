"""Corpus files as decompressed byte streams: plain, `.gz` or `.zst`, with every way a compressed file can be bad
(not of its format, corrupt, truncated) one DataError naming the file and the fix.

    python -c "from trainflow.data.documents import Documents; print(sum(1 for _ in Documents(['a.jsonl.zst'])))"

zstandard's stream reader returns a truncated frame's bytes as if the file ended there (a half-copied corpus would
be tokenised without a word), so a `.zst` file's frames are walked first (check_zstd_frames).
"""

from __future__ import annotations

import gzip
import zlib
from collections.abc import Iterator
from contextlib import contextmanager
from typing import BinaryIO

import zstandard

from trainflow.data.record import DataError

COMPRESSIONS = (".gz", ".zst")
FIX = "re-create or re-download it, or drop it from the corpus's glob"
ZSTD_MAGIC = 0xFD2FB528
SKIPPABLE = range(0x184D2A50, 0x184D2A60)


def check_zstd_frames(raw: BinaryIO) -> None:
    """Walk the frame and block headers of a zstd file (RFC 8878, sections 3.1.1-3.1.2; block contents are skipped)
    and raise EOFError where the file ends before its last frame does. zstandard's stream reader returns a cut
    frame's bytes as if the file ended there, and decompressobj has no output limit (one 4 kB feed of a corpus of
    repeated lines gave 37 MB), so truncation is found here, for the cost of one small read per 128 kB block."""
    size, at = raw.seek(0, 2), 0

    def read(n: int) -> bytes:
        nonlocal at
        raw.seek(at)
        data, at = raw.read(n), at + n
        if len(data) < n:
            raise EOFError("the zstd stream ends inside a frame")
        return data

    while at < size:
        magic = int.from_bytes(read(4), "little")
        if magic in SKIPPABLE:
            at += int.from_bytes(read(4), "little")
            continue
        if magic != ZSTD_MAGIC:
            raise zstandard.ZstdError("Unknown frame descriptor")
        (descriptor,) = read(1)
        single_segment, content_size_flag = descriptor >> 5 & 1, descriptor >> 6
        content_size = (1 if single_segment else 0, 2, 4, 8)[content_size_flag]
        at += (not single_segment) + (0, 1, 2, 4)[descriptor & 3] + content_size  # window, dictionary id, size
        last = False
        while not last:
            header = int.from_bytes(read(3), "little")
            last, kind, length = header & 1, header >> 1 & 3, header >> 3
            at += 1 if kind == 1 else length  # an RLE block holds one byte repeated `length` times
        at += 4 * (descriptor >> 2 & 1)  # the content checksum
    if at > size:
        raise EOFError("the zstd stream ends inside a frame")


def describe(path: str, err: BaseException) -> str:
    """The one line of a compressed file that cannot be read: which file, what is wrong with it, the fix."""
    kind = "gzip" if path.endswith(".gz") else "zstd"
    if isinstance(err, EOFError):
        return f"{path} is truncated: its {kind} stream ends before its end marker; {FIX}"
    if isinstance(err, gzip.BadGzipFile) or "Unknown frame descriptor" in str(err):
        return f"{path} is not {kind}-compressed though its name ends in .{path.rsplit('.', 1)[1]}; {FIX}, or rename it"
    return f"{path} is corrupt ({kind}: {' '.join(str(err).split())}); {FIX}"


READ_ERRORS = (EOFError, gzip.BadGzipFile, zlib.error, zstandard.ZstdError)
"""What reading a bad compressed file raises, turned into DataError by `reading`."""


@contextmanager
def reading(path: str) -> Iterator[None]:
    """Read `path` inside this block: a bad compressed stream is one DataError naming it."""
    try:
        yield
    except READ_ERRORS as err:
        raise DataError(describe(path, err)) from err


@contextmanager
def open_binary(path: str) -> Iterator[tuple[BinaryIO, BinaryIO]]:
    """(decompressed stream, raw file): the raw file's position is the progress through it."""
    with open(path, "rb") as raw:
        if path.endswith(".gz"):
            with gzip.GzipFile(fileobj=raw) as stream:
                yield stream, raw
        elif path.endswith(".zst"):
            check_zstd_frames(raw)
            raw.seek(0)
            with zstandard.ZstdDecompressor().stream_reader(raw, read_across_frames=True, closefd=False) as stream:
                yield stream, raw
        else:
            yield raw, raw
