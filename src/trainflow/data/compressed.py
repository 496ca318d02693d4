"""Corpus files as decompressed byte streams: plain, `.gz` or `.zst`, with every way a compressed file can be bad
(not of its format, corrupt, truncated) one DataError naming the file and the fix.

    python -c "from trainflow.data.documents import Documents; print(sum(1 for _ in Documents(['a.jsonl.zst'])))"

zstandard's stream reader returns a truncated frame's bytes as if the file ended there (a half-copied corpus would
be tokenised without a word), so a `.zst` file's frames are walked first (check_zstd_frames). A damaged block of a
frame without a content checksum (zstandard.ZstdCompressor writes none by default; the zstd command does) often
decompresses to wrong bytes without an error: a bad line of such a file may be damage (unverified).
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
GZIP_MAGIC = b"\x1f\x8b"
SKIPPABLE = range(0x184D2A50, 0x184D2A60)


class TrailingBytes(ValueError):
    """Bytes after a compressed file's last frame or member that begin none (an append or a copy gone wrong)."""


def check_zstd_frames(raw: BinaryIO) -> bool:
    """Walk the frame and block headers of a zstd file (RFC 8878, sections 3.1.1-3.1.2; block contents are skipped)
    and raise EOFError where the file ends before its last frame does. zstandard's stream reader returns a cut
    frame's bytes as if the file ended there, and decompressobj has no output limit (one 4 kB feed of a corpus of
    repeated lines gave 37 MB), so truncation is found here, for the cost of one small read per 128 kB block.
    Whether every frame carries a content checksum, which zstd checks as it decompresses."""
    size, at, checksummed = raw.seek(0, 2), 0, True

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
        if magic != ZSTD_MAGIC and at > 4:
            raise TrailingBytes(f"{size - at + 4} bytes after its last zstd frame (from byte {at - 4})")
        if magic != ZSTD_MAGIC:
            raise zstandard.ZstdError("Unknown frame descriptor")
        (descriptor,) = read(1)
        checksummed &= bool(descriptor >> 2 & 1)
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
    return checksummed


def unverified(path: str) -> str | None:
    """Why a bad line of `path` may be a damaged block rather than a bad line (None: damage would fail the read): a
    `.zst` file with a frame without a content checksum. gzip checks a CRC-32 at each member's end."""
    if not path.endswith(".zst"):
        return None
    with open(path, "rb") as raw:
        if check_zstd_frames(raw):
            return None
    return (
        f"{path}'s zstd frames carry no checksum, so a damaged block reads as bad lines and is not skipped as one: "
        "check the file against its source, and re-create it with a checksum (zstd --check, the zstd command's default)"
    )


def describe(path: str, err: BaseException) -> str:
    """The one line of a compressed file that cannot be read: which file, what is wrong with it, the fix."""
    kind = "gzip" if path.endswith(".gz") else "zstd"
    if isinstance(err, EOFError):
        return f"{path} is truncated: its {kind} stream ends before its end marker; {FIX}"
    if isinstance(err, gzip.BadGzipFile) and starts_with(path, GZIP_MAGIC):  # a first member, then no second
        err = TrailingBytes("bytes after its last gzip member")
    if isinstance(err, TrailingBytes):
        return f"{path} holds {err} that begin no {kind} stream (trailing garbage); {FIX}"
    if isinstance(err, gzip.BadGzipFile) or "Unknown frame descriptor" in str(err):
        return f"{path} is not {kind}-compressed though its name ends in .{path.rsplit('.', 1)[1]}; {FIX}, or rename it"
    return f"{path} is corrupt ({kind}: {' '.join(str(err).split())}); {FIX}"


def starts_with(path: str, magic: bytes) -> bool:
    with open(path, "rb") as raw:
        return raw.read(len(magic)) == magic


READ_ERRORS = (EOFError, TrailingBytes, gzip.BadGzipFile, zlib.error, zstandard.ZstdError)
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
