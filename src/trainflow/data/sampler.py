"""The pure-function batch sampler over a corpus's token shards (data.index, data.tokens' layout).

    python -c "from trainflow.data.sampler import TokenSampler; print(TokenSampler('index.json', seq_len=16, seed=0))"

Each split is read as the concatenation of the shards' datasets in index order: a window starts at a global
token position drawn from (seed, split, step), and may run from one shard into the next. So the batch for
(step, rank) is a function of the seed and the shards' token counts alone (one shard reads exactly as the
single token file did), and a resumed run needs only the step to continue the same data order.

With cross_document=False (train.cross_document) a window may not run over an end-of-document token into the
next document: each row's start is re-drawn (from its own stream of (seed, split, step, row)) until its
inputs hold no end-of-document token, its last target may be one; after MAX_DRAWS draws the batch fails,
naming the fix (documents shorter than a window cannot give one).

While a training step computes, a background thread reads the next step's batch (a pure function, so reading
ahead changes nothing but when the bytes are read); evaluation batches are read when asked.
"""

from __future__ import annotations

from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path

import h5py
import numpy as np
import torch

from trainflow.data.index import read_index
from trainflow.data.record import DataError, check_size

RERUN = "stage_data (snakemake --forcerun stage_data)"
MAX_DRAWS = 1000
"""Draws per row for a window inside one document (cross_document=False) before the batch is refused."""


class TokenSampler:
    """Batches of (inputs, targets) windows from the shards of a token index, a pure function of (seed, step)."""

    def __init__(self, path: str | Path, *, seq_len: int, seed: int, cross_document: bool = True) -> None:
        check_size(Path(path), rerun=RERUN)
        index, shards = read_index(path, rerun=RERUN)
        self.eot_id = int(index["tokenizer"]["eot_id"])
        self.cross_document = cross_document
        self.reader = ThreadPoolExecutor(max_workers=1, thread_name_prefix="prefetch")
        self.ahead: tuple[tuple, Future] | None = None
        self.files = []
        for shard in shards:
            check_size(shard.path, rerun=RERUN)
            try:
                self.files.append(h5py.File(shard.path, "r"))
            except OSError as err:
                self.close()
                raise DataError(f"{shard.path} cannot be read as HDF5 ({err}); it is damaged: rerun {RERUN}") from err
        self.seq_len, self.seed = seq_len, seed
        # Where each shard's tokens begin in the concatenated split: (shards + 1,) per split.
        self.offsets = {}
        for split in ("train", "val"):
            counts = [len(f[split]) for f in self.files]
            self.offsets[split] = np.concatenate([[0], np.cumsum(counts)])
            if self.offsets[split][-1] < seq_len + 2:
                self.close()
                raise DataError(
                    f"{path}: split '{split}' has {self.offsets[split][-1]} tokens, fewer than "
                    f"model.seq_len({seq_len}) + 2; use a larger data.corpus or a smaller data.val_fraction"
                )

    def read(self, split: str, start: int, n: int) -> np.ndarray:
        """Tokens [start, start + n) of the concatenated split, from one shard or several."""
        offsets, pieces = self.offsets[split], []
        shard = int(np.searchsorted(offsets, start, side="right")) - 1
        while n > 0:
            local = start - offsets[shard]
            piece = self.files[shard][split][local : local + n]
            pieces.append(piece)
            start, n, shard = start + len(piece), n - len(piece), shard + 1
        return pieces[0] if len(pieces) == 1 else np.concatenate(pieces)

    def batch(self, split: str, index: int, global_batch: int, rows: slice) -> tuple[torch.Tensor, torch.Tensor]:
        """Rows `rows` of the global batch number `index` of `split`: (B, T) inputs and targets. A training batch
        starts the read of the next one in the background."""
        if split == "train":  # an evaluation between two steps leaves the next step's read running
            key = (index, global_batch, rows.start, rows.stop, rows.step)
            ahead, self.ahead = self.ahead, None
            hit = ahead is not None and ahead[0] == key
            windows = ahead[1].result() if hit else self.windows(split, index, global_batch, rows)
            after = (index + 1, global_batch, rows.start, rows.stop, rows.step)
            self.ahead = (after, self.reader.submit(self.windows, split, index + 1, global_batch, rows))
        else:
            windows = self.windows(split, index, global_batch, rows)
        window = torch.from_numpy(windows)
        return window[:, :-1], window[:, 1:]

    def windows(self, split: str, index: int, global_batch: int, rows: slice) -> np.ndarray:
        """The (B, T + 1) token windows of those rows."""
        split_id, last = 0 if split == "train" else 1, int(self.offsets[split][-1]) - self.seq_len - 1
        if self.cross_document:
            starts = np.random.default_rng((self.seed, split_id, index)).integers(0, last, size=global_batch)[rows]
            return np.stack([self.read(split, int(s), self.seq_len + 1) for s in starts]).astype(np.int64)
        streams = [(self.seed, split_id, index, row) for row in range(global_batch)[rows]]
        return np.stack([self.inside_one_document(split, stream, last) for stream in streams]).astype(np.int64)

    def inside_one_document(self, split: str, stream: tuple[int, ...], last: int) -> np.ndarray:
        """A window whose inputs hold no end-of-document token, drawn from its own random stream."""
        rng = np.random.default_rng(stream)
        for _ in range(MAX_DRAWS):
            window = self.read(split, int(rng.integers(0, last)), self.seq_len + 1)
            if not (window[:-1] == self.eot_id).any():
                return window
        raise DataError(
            f"no window of model.seq_len({self.seq_len}) + 1 tokens inside one document of split '{split}' in "
            f"{MAX_DRAWS} draws: the documents are shorter than a window; set train.cross_document=true or lower "
            "model.seq_len"
        )

    def close(self) -> None:
        self.reader.shutdown(wait=True, cancel_futures=True)
        for f in self.files:
            f.close()
