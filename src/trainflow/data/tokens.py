"""Token shards: documents tokenised and appended to a chunked HDF5 file, streamed with bounded memory.

    python -m trainflow.stages.prepare_data data.corpus='docs/**/*.jsonl.zst' data.tokenizer=bpe

Layout of a shard: 1-D datasets `train` and `val` of uint16 (uint32 when the vocabulary exceeds 65,536;
attribute `dtype`), each document as [bos] tokens eot, chunked for random reads; `sources` (one
"path<TAB>documents" line per input file) and attributes recording the tokenizer (kind, JSON, hash, ids),
the corpus and the token counts. data.sampler reads it; data.index lists the shards of a corpus.
"""

from __future__ import annotations

import logging
from pathlib import Path

import h5py
import numpy as np

from trainflow.data.documents import Documents, is_validation
from trainflow.data.record import DataError, recorded
from trainflow.data.tokenizer import (
    ByteTokenizer,
    HfTokenizer,
    token_dtype,
    tokenizer_hash,
)
from trainflow.progress import Progress

SPLITS = ("train", "val")
BATCH_BYTES = 4 << 20  # text tokenised per encode_batch call: large enough for its threads, small in memory


class SplitWriter:
    """Appends token arrays to a resizable dataset, buffered to whole chunks (writes of one token each
    would cost a chunk rewrite each)."""

    def __init__(self, f: h5py.File, name: str, dtype: np.dtype, chunk: int) -> None:
        self.data = f.create_dataset(name, shape=(0,), maxshape=(None,), dtype=dtype, chunks=(chunk,))
        self.buffer: list[np.ndarray] = []
        self.buffered = self.tokens = self.documents = 0
        self.flush_at = 16 * chunk

    def add(self, tokens: np.ndarray) -> None:
        self.buffer.append(tokens)
        self.buffered += len(tokens)
        self.tokens += len(tokens)
        self.documents += 1
        if self.buffered >= self.flush_at:
            self.flush()

    def flush(self) -> None:
        if not self.buffer:
            return
        end = len(self.data)
        self.data.resize((end + self.buffered,))
        self.data[end:] = np.concatenate(self.buffer)
        self.buffer, self.buffered = [], 0


class ShardWriter:
    """Documents into the train and val datasets of an open file. One document is held back: a tiny corpus
    whose hash-based holdout leaves a side empty holds out its last document instead (and trains on the rest)."""

    def __init__(self, f: h5py.File, *, dtype: np.dtype, chunk: int, eot_id: int, bos_id: int | None) -> None:
        self.f, self.dtype, self.chunk = f, dtype, chunk
        self.splits = {split: SplitWriter(f, split, dtype, chunk) for split in SPLITS}
        self.head = np.array([] if bos_id is None else [bos_id], dtype=dtype)
        self.tail = np.array([eot_id], dtype=dtype)
        self.pending: tuple[np.ndarray, str] | None = None

    def add(self, ids: np.ndarray, split: str) -> None:
        if self.pending is not None:
            self.splits[self.pending[1]].add(self.pending[0])
        self.pending = (np.concatenate([self.head, ids.astype(self.dtype, copy=False), self.tail]), split)

    def close(self) -> dict[str, dict[str, int]]:
        """Flush; the tokens and documents per split."""
        if self.pending is not None:
            tokens, split = self.pending
            train, val = self.splits["train"], self.splits["val"]
            if val.documents == 0:
                split = "val"
            elif train.documents == 0 and split == "val":  # all held out: the last validates, the rest trains
                val.flush()
                self.f.move("val", "train")
                self.splits["train"], self.splits["val"] = val, SplitWriter(self.f, "val", self.dtype, self.chunk)
                split = "val"
            self.splits[split].add(tokens)
        for writer in self.splits.values():
            writer.flush()
        return {s: {"tokens": w.tokens, "documents": w.documents} for s, w in self.splits.items()}


def write_shard(
    out: Path,
    docs: Documents,
    tokenizer: ByteTokenizer | HfTokenizer,
    *,
    val_fraction: float,
    chunk: int,
    attrs: dict,
    log: logging.Logger,
) -> dict:
    """Tokenise `docs` into `out` atomically, its size and CRC-32C recorded beside it (data.record): a failure
    leaves neither a temporary file nor a record. The shard's summary (counts, dtype) is returned."""
    dtype = token_dtype(tokenizer.vocab_size)
    total_mb = max(1, sum(Path(p).stat().st_size for p in docs.files) // 1_000_000)
    progress = Progress(log, "Tokenised", total_mb, unit="MB")
    with recorded(out) as tmp, h5py.File(tmp, "w") as f:
        writer = ShardWriter(f, dtype=dtype, chunk=chunk, eot_id=tokenizer.eot_id, bos_id=tokenizer.bos_id)
        batch: list = []
        size = 0
        for doc in docs:
            batch.append(doc)
            size += len(doc.text)
            if size >= BATCH_BYTES:
                encode_into(writer, tokenizer, batch, val_fraction)
                batch, size = [], 0
                progress.update(docs.raw_bytes // 1_000_000, f"{docs.documents} documents")
        encode_into(writer, tokenizer, batch, val_fraction)
        progress.update(total_mb, f"{docs.documents} documents")
        counts = writer.close()
        if not docs.documents:
            raise DataError(
                f"the {len(docs.files)} files of {out.name} hold no text ({', '.join(docs.files[:3])}, ...); "
                "drop them from data.corpus or use fewer data.shards"
            )
        summary = {
            **{f"{s}_{k}": v for s, c in counts.items() for k, v in c.items()},
            "dtype": dtype.name,
            "source_bytes": docs.text_bytes,
            "skipped_lines": docs.skipped,
        }
        tokenizer_attrs = {
            "tokenizer": tokenizer.kind,
            "tokenizer_json": tokenizer.to_json(),
            "tokenizer_sha256": tokenizer_hash(tokenizer),
            "vocab_size": tokenizer.vocab_size,
            "eot_id": tokenizer.eot_id,
            "bos_id": -1 if tokenizer.bos_id is None else tokenizer.bos_id,
        }
        f.attrs.update({**summary, **tokenizer_attrs, **attrs})
        f.create_dataset("sources", data=[f"{p}\t{n}" for p, n in docs.per_file.items()], dtype=h5py.string_dtype())
    return summary


def encode_into(writer: ShardWriter, tokenizer: ByteTokenizer | HfTokenizer, batch: list, val_fraction: float) -> None:
    for doc, ids in zip(batch, tokenizer.encode_batch([d.text for d in batch])):
        writer.add(ids, "val" if is_validation(doc.key, val_fraction) else "train")
