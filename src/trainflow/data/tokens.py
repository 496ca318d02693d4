"""Token files: tokenisers and the chunked HDF5 layout.

    python -m trainflow.stages.prepare_data data.corpus='docs/**/*.txt'

Layout of tokens.h5: 1-D uint16 datasets `train` and `val` (documents joined by an end-of-document
token, chunked for random reads), `sources` (one path per document) and attributes recording the
tokenizer, vocabulary size, corpus glob and token counts. data.sampler reads it.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from pathlib import Path

import h5py
import numpy as np

from trainflow.config import BYTE_VOCAB
from trainflow.data.record import recorded

EOT_TEXT = "<|endoftext|>"


@dataclass
class ByteTokenizer:
    """UTF-8 bytes as tokens 0..255 and 256 as end of document: nothing to train, nothing unknown."""

    vocab_size: int = BYTE_VOCAB
    eot_id: int = 256

    def encode_batch(self, texts: list[str]) -> list[np.ndarray]:
        return [np.frombuffer(t.encode("utf-8"), dtype=np.uint8).astype(np.uint16) for t in texts]

    def to_json(self) -> str:
        return json.dumps({"type": "byte", "vocab_size": self.vocab_size})


class BpeTokenizer:
    """Byte-level BPE trained on the corpus with HuggingFace `tokenizers`."""

    def __init__(self, tokenizer) -> None:
        self.tok = tokenizer
        self.vocab_size = tokenizer.get_vocab_size()
        self.eot_id = tokenizer.token_to_id(EOT_TEXT)

    @classmethod
    def train(cls, texts: list[str], vocab_size: int) -> BpeTokenizer:
        from tokenizers import ByteLevelBPETokenizer

        tok = ByteLevelBPETokenizer()
        tok.train_from_iterator(texts, vocab_size=vocab_size, special_tokens=[EOT_TEXT], show_progress=False)
        return cls(tok)

    def encode_batch(self, texts: list[str]) -> list[np.ndarray]:
        return [np.asarray(e.ids, dtype=np.uint16) for e in self.tok.encode_batch(texts)]

    def to_json(self) -> str:
        return self.tok._tokenizer.to_str()


def is_validation(path: str, val_fraction: float) -> bool:
    """Hold out a document by a hash of its name, so the split survives reordering and new files."""
    digest = hashlib.sha256(Path(path).name.encode()).digest()
    return int.from_bytes(digest[:8], "little") / 2**64 < val_fraction


def write_tokens(path: Path, splits: dict[str, list[np.ndarray]], *, eot_id: int, attrs: dict, chunk: int) -> None:
    """Write the token datasets to `path` atomically, with its size and CRC-32C recorded beside it
    (data.record); a failure leaves neither a temporary file nor a record."""
    with recorded(path) as tmp, h5py.File(tmp, "w") as f:
        for split, docs in splits.items():
            joined = np.concatenate([np.append(d, np.uint16(eot_id)) for d in docs]) if docs else np.zeros(0, np.uint16)
            f.create_dataset(split, data=joined, chunks=(min(chunk, max(len(joined), 1)),))
            f.attrs[f"{split}_tokens"] = len(joined)
            f.attrs[f"{split}_documents"] = len(docs)
        for key, value in attrs.items():
            f.attrs[key] = value
