"""The corpus as a stream of documents, read with bounded memory whatever its size.

    python -c "from trainflow.data.documents import Documents; print(sum(1 for _ in Documents(['a.jsonl.zst'])))"

The format follows the file name: `.jsonl` holds one JSON object per line and `.parquet` one row per
document, the text in `text_field`; any other file is one document (as source trees and books are).
Each may end in `.gz` or `.zst`. Text is decoded as UTF-8 with undecodable bytes replaced, in Python's
text mode (universal newlines), so a text file reads exactly as `Path.read_text` reads it. Only one
document (or one Parquet row group of the text column) is held at a time.
"""

from __future__ import annotations

import hashlib
import io
import json
import shutil
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO

from trainflow.data.compressed import COMPRESSIONS, open_binary, reading, unverified
from trainflow.data.record import DataError


@dataclass(frozen=True)
class Document:
    key: str
    """What the validation holdout hashes: the file name, `name:line` (JSONL) or `name#row` (Parquet), the
    name without a compression suffix."""
    text: str


def file_format(path: str) -> str:
    """`jsonl`, `parquet` or `text`, from the suffix under any compression suffix."""
    name = key_name(path).lower()
    return "jsonl" if name.endswith(".jsonl") else "parquet" if name.endswith(".parquet") else "text"


def key_name(path: str) -> str:
    """The file's name without a compression suffix: compressing a corpus keeps its validation split."""
    name = Path(path).name
    for suffix in COMPRESSIONS:
        name = name.removesuffix(suffix)
    return name


def is_validation(key: str, val_fraction: float) -> bool:
    """Hold out a document by a hash of its key, so the split survives reordering and new files."""
    digest = hashlib.sha256(key.encode()).digest()
    return int.from_bytes(digest[:8], "little") / 2**64 < val_fraction


class Documents:
    """The non-empty documents of `files` in order, stopping once `max_bytes` of text were read (0 = all).

    `raw_bytes` is how far through the files (on disk) the stream has come, for progress lines;
    `skipped` counts the bad lines data.bad_lines=skip let through; `text_bytes` the UTF-8 text read."""

    def __init__(self, files: list[str], *, text_field: str = "text", bad_lines: str = "fail", max_bytes: int = 0):
        self.files, self.text_field, self.bad_lines, self.max_bytes = files, text_field, bad_lines, max_bytes
        self.raw_bytes = self.text_bytes = self.documents = self.skipped = 0
        self.per_file: dict[str, int] = {}
        """Documents read from each file (the index's provenance)."""

    def __iter__(self) -> Iterator[Document]:
        done = 0
        for path in self.files:
            size = Path(path).stat().st_size
            read = {"jsonl": self.jsonl, "parquet": self.parquet, "text": self.text}[file_format(path)]
            self.per_file[path] = 0
            with reading(path):  # a truncated or mislabelled compressed file: one line naming it
                for doc in read(path, done):
                    if not doc.text.strip():
                        continue
                    self.documents += 1
                    self.per_file[path] += 1
                    self.text_bytes += len(doc.text.encode("utf-8"))
                    yield doc
                    if self.max_bytes and self.text_bytes >= self.max_bytes:
                        return
            done += size
            self.raw_bytes = done

    def text(self, path: str, done: int) -> Iterator[Document]:
        with open_binary(path) as (stream, _):
            text = io.TextIOWrapper(stream, encoding="utf-8", errors="replace").read()
        yield Document(key_name(path), text)

    def jsonl(self, path: str, done: int) -> Iterator[Document]:
        name = key_name(path)
        with open_binary(path) as (stream, raw):
            lines = io.TextIOWrapper(stream, encoding="utf-8", errors="replace")
            for number, line in enumerate(lines, 1):
                if not line.strip():
                    continue
                text, why = self.parse(line)
                if why is not None:
                    self.bad(f"{path}:{number} {why}", unverified(path))
                    continue
                self.raw_bytes = done + raw.tell()
                yield Document(f"{name}:{number}", text)

    def parquet(self, path: str, done: int) -> Iterator[Document]:
        import pyarrow.parquet as pq

        name, size = key_name(path), Path(path).stat().st_size
        with seekable(path) as source:
            try:
                pf = pq.ParquetFile(source)
            except Exception as err:  # pyarrow raises ArrowInvalid and OSError subclasses alike
                raise DataError(f"{path} cannot be read as Parquet ({err}); check the file or drop it") from err
            if self.text_field not in pf.schema_arrow.names:
                raise DataError(
                    f"{path} has no column data.text_field({self.text_field!r}) (columns: "
                    f"{', '.join(pf.schema_arrow.names)}); set data.text_field to the text column"
                )
            row = 0
            # One row group of the one column at a time: the memory bound of a Parquet file.
            for group in range(pf.num_row_groups):
                for text in pf.read_row_group(group, columns=[self.text_field]).column(0).to_pylist():
                    row += 1
                    if not isinstance(text, str):
                        self.bad(f"{path}#{row} holds {type(text).__name__} in {self.text_field!r}, not a string")
                        continue
                    yield Document(f"{name}#{row}", text)
                self.raw_bytes = done + size * (group + 1) // pf.num_row_groups

    def parse(self, line: str) -> tuple[str, str | None]:
        """A JSONL line's text, or why it is no document: not JSON, nested past the parser's recursion limit, not an
        object, or without a string in data.text_field."""
        field = f"data.text_field({self.text_field!r})"
        try:
            value = json.loads(line)
        except RecursionError:
            return "", "is nested too deeply to parse"
        except ValueError as err:
            return "", f"is not JSON ({err})"
        if not isinstance(value, dict):
            return "", f"holds a JSON {type(value).__name__}, not an object with the text in {field}"
        if self.text_field not in value:
            keys = ", ".join(map(repr, list(value)[:8])) or "none"
            return "", f"has no field {field} (its fields: {keys}): set data.text_field to the field holding the text"
        if not isinstance(text := value[self.text_field], str):
            return "", f"holds {type(text).__name__} in {field}, not a string"
        return text, None

    def bad(self, message: str, damage: str | None = None) -> None:
        """A bad line: skipped with a count, or one DataError; `damage` says why it may be a damaged file instead."""
        if damage:
            raise DataError(f"{message}; {damage}")
        if self.bad_lines == "fail":
            raise DataError(f"{message}; fix the line or set data.bad_lines=skip to skip such lines with a count")
        self.skipped += 1


@contextmanager
def seekable(path: str) -> Iterator[str | BinaryIO]:
    """Parquet needs random access: a compressed file is decompressed to a temporary file first."""
    if not path.endswith(COMPRESSIONS):
        yield path
        return
    with tempfile.TemporaryFile() as tmp, open_binary(path) as (stream, _):
        shutil.copyfileobj(stream, tmp, 8 << 20)
        tmp.seek(0)
        yield tmp
