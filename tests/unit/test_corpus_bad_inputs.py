"""Bad corpus files a new user meets, each one line naming the file (and line) and the fix, nothing written: a
truncated gzip or zstd file, a .gz or .zst that is not of its format or has trailing garbage, a damaged zstd block
(with a checksum: corrupt; without one: no bad line to skip), a JSONL line nested past the parser's limit
(a bad line, so data.bad_lines=skip counts it), a JSONL object without data.text_field."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import pytest
import zstandard

from tests.conftest import make_config
from trainflow.data.documents import Documents
from trainflow.data.record import DataError
from trainflow.stages import prepare_data

LINES = [json.dumps({"text": f"document {i} " * 40}) for i in range(400)]
BODY = ("\n".join(LINES) + "\n").encode()


def write(path: Path, data: bytes) -> Path:
    path.write_bytes(data)
    return path


BAD_FILES = {
    "truncated gzip": ("c.jsonl.gz", lambda: gzip.compress(BODY)[:-200], r"is truncated: its gzip stream ends"),
    "truncated zstd": (
        "c.jsonl.zst",
        lambda: zstandard.ZstdCompressor().compress(BODY)[:-200],
        r"is truncated: its zstd stream ends",
    ),
    "not zstd": ("c.jsonl.zst", lambda: BODY, r"is not zstd-compressed though its name ends in \.zst"),
    "not gzip": ("c.txt.gz", lambda: BODY, r"is not gzip-compressed though its name ends in \.gz"),
    "corrupt gzip": ("c.jsonl.gz", lambda: corrupt(gzip.compress(BODY)), r"is corrupt \(gzip: "),
    "gzip with trailing garbage": (
        "c.jsonl.gz",
        lambda: gzip.compress(BODY) + b"garbage!",
        r"holds bytes after its last gzip member that begin no gzip stream \(trailing garbage\)",
    ),
    "zstd with trailing garbage": (
        "c.jsonl.zst",
        lambda: zstandard.ZstdCompressor().compress(BODY) + b"garbage!",
        r"holds 8 bytes after its last zstd frame \(from byte \d+\) that begin no zstd stream \(trailing garbage\)",
    ),
    "damaged zstd block, checksummed": (
        "c.jsonl.zst",
        lambda: damaged_block(checksum=True),
        r"is corrupt \(zstd: .*checksum",
    ),
}


def corrupt(data: bytes) -> bytes:
    return data[:100] + bytes(b ^ 0x5A for b in data[100:200]) + data[200:]


def damaged_block(*, checksum: bool) -> bytes:
    """A zstd frame with one bit flipped where, without a content checksum, it decompresses without an error to lines
    that are no JSON (about a third of single flips do); with a checksum, the same flip of the same frame."""
    plain = zstandard.ZstdCompressor().compress(BODY)
    at = next(at for at in range(20, len(plain) - 8) if breaks_lines(flip(plain, at)))
    return flip(zstandard.ZstdCompressor(write_checksum=True).compress(BODY), at) if checksum else flip(plain, at)


def flip(data: bytes, at: int) -> bytes:
    return data[:at] + bytes([data[at] ^ 0x08]) + data[at + 1 :]


def breaks_lines(data: bytes) -> bool:
    try:
        out = zstandard.ZstdDecompressor().stream_reader(data, read_across_frames=True).read()
    except zstandard.ZstdError:
        return False
    return len(out) == len(BODY) and any(not is_json(line) for line in out.splitlines())


def is_json(line: bytes) -> bool:
    try:
        json.loads(line)
        return True
    except ValueError:
        return False


@pytest.mark.parametrize("case", BAD_FILES, ids=list(BAD_FILES))
def test_a_bad_compressed_file_fails_in_one_line_naming_it_and_writes_no_shard(tmp_path, case):
    name, make, match = BAD_FILES[case]
    path = write(tmp_path / name, make())
    out = tmp_path / "tokens/index.json"
    cfg = make_config("prepare_data", tmp_path, f"data.corpus={path}", f"io.tokens={out}", "data.bad_lines=skip")
    with pytest.raises(DataError, match=match) as err:
        prepare_data.run(cfg)
    message = str(err.value)
    assert message.startswith(str(path)) and "\n" not in message and "drop it from the corpus" in message
    assert not out.parent.exists() or not list(out.parent.iterdir())


def test_a_damaged_zstd_block_without_a_checksum_is_no_skipped_bad_line(tmp_path):
    """zstd cannot tell such a block's wrong bytes from the file's: the lines it breaks are not counted as skipped."""
    data = damaged_block(checksum=False)
    path = write(tmp_path / "c.jsonl.zst", data)
    for bad_lines in ("skip", "fail"):
        docs = Documents([str(path)], bad_lines=bad_lines)
        with pytest.raises(
            DataError, match=rf"^{path}:\d+ is not JSON .* {path}'s zstd frames carry no checksum, so a "
        ):
            list(docs)
        assert docs.skipped == 0
    intact = write(
        tmp_path / "d.jsonl.zst", zstandard.ZstdCompressor().compress(BODY + b"{\n")
    )  # a bad line, no damage
    with pytest.raises(DataError, match=r"zstd frames carry no checksum"):
        list(Documents([str(intact)], bad_lines="skip"))
    checked = write(tmp_path / "e.jsonl.zst", zstandard.ZstdCompressor(write_checksum=True).compress(BODY + b"{\n"))
    docs = Documents([str(checked)], bad_lines="skip")
    assert len(list(docs)) == len(LINES) and docs.skipped == 1


def test_several_zstd_frames_read_as_one_stream(tmp_path):
    """pzstd, or `cat a.zst b.zst`, writes several frames: all of them are read, not the first alone."""
    z = zstandard.ZstdCompressor()
    path = write(tmp_path / "c.jsonl.zst", z.compress(BODY[: len(BODY) // 2]) + z.compress(BODY[len(BODY) // 2 :]))
    assert [d.text for d in Documents([str(path)])] == [json.loads(line)["text"] for line in LINES]


def test_a_deeply_nested_jsonl_line_is_a_bad_line(tmp_path):
    path = write(tmp_path / "c.jsonl", b"[" * 100_000 + b"\n" + BODY)
    with pytest.raises(DataError, match=rf"^{path}:1 is nested too deeply to parse; .*data\.bad_lines=skip"):
        list(Documents([str(path)]))
    docs = Documents([str(path)], bad_lines="skip")
    assert len(list(docs)) == len(LINES) and docs.skipped == 1


def test_a_jsonl_object_without_the_text_field_names_data_text_field(tmp_path):
    path = write(tmp_path / "c.jsonl", json.dumps({"content": "x", "id": 3}).encode() + b"\n")
    with pytest.raises(DataError) as err:
        list(Documents([str(path)]))
    assert str(err.value).startswith(
        f"{path}:1 has no field data.text_field('text') (its fields: 'content', 'id'): set data.text_field to the "
        "field holding the text"
    )
