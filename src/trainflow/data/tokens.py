"""Token files: tokenisers, the chunked HDF5 layout, and the pure-function batch sampler.

    python -m trainflow.stages.prepare_data data.corpus='docs/**/*.txt'

Layout of tokens.h5: 1-D uint16 datasets `train` and `val` (documents joined by an end-of-document
token, chunked for random reads), `sources` (one path per document) and attributes recording the
tokenizer, vocabulary size, corpus glob and token counts. The batch for (step, rank) is a function
of the seed alone, so a resumed run needs only the step to continue the same data order.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from pathlib import Path

import h5py
import numpy as np
import torch

from trainflow.config import BYTE_VOCAB
from trainflow.data.record import DataError, check_size, recorded

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
    def train(cls, texts: list[str], vocab_size: int) -> "BpeTokenizer":
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


class TokenSampler:
    """Batches of (inputs, targets) windows from a token file, a pure function of (seed, step)."""

    def __init__(self, path: str | Path, *, seq_len: int, seed: int) -> None:
        rerun = "stage_data (snakemake --forcerun stage_data)"
        check_size(Path(path), rerun=rerun)
        try:
            self.file = h5py.File(path, "r")
        except OSError as err:
            raise DataError(f"{path} cannot be read as HDF5 ({err}); it is damaged: rerun {rerun}") from err
        self.seq_len, self.seed = seq_len, seed
        for split in ("train", "val"):
            n = len(self.file[split])
            if n < seq_len + 2:
                raise DataError(
                    f"{path}: split '{split}' has {n} tokens, fewer than model.seq_len({seq_len}) + 2; "
                    "use a larger data.corpus or a smaller data.val_fraction"
                )

    def batch(self, split: str, index: int, global_batch: int, rows: slice) -> tuple[torch.Tensor, torch.Tensor]:
        """Rows `rows` of the global batch number `index` of `split`: (B, T) inputs and targets."""
        data = self.file[split]
        rng = np.random.default_rng((self.seed, 0 if split == "train" else 1, index))
        starts = rng.integers(0, len(data) - self.seq_len - 1, size=global_batch)[rows]
        windows = np.stack([data[s : s + self.seq_len + 1] for s in starts]).astype(np.int64)  # (B, T+1)
        window = torch.from_numpy(windows)
        return window[:, :-1], window[:, 1:]

    def close(self) -> None:
        self.file.close()
