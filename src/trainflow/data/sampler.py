"""The pure-function batch sampler over the token shards of a corpus or a mixture of them (data.index, data.tokens'
layout).

    python -c "from trainflow.data.sampler import TokenSampler; print(TokenSampler('index.json', seq_len=16, seed=0))"

Each source's split is read as the concatenation of its shards' datasets in index order: a window starts at a token
position of its source drawn from (seed, split, step), and may run from one shard into the next. Which source each
row of a batch comes from is data.mixture's pure function of (seed, step, row) and the weights. So the batch for
(step, rank) is a function of the seed, the weights and the shards' token counts alone (one source reads exactly as
the single corpus did before mixtures: its rows' draws are the same), and a resumed run needs only the step to
continue the same data order. An evaluation reads one source (`source=`): each source has its validation split.

With cross_document=False (train.cross_document) a window may not run over an end-of-document token into the
next document: each row's start is re-drawn (from its own stream of (seed, split, step, row)) until its
inputs hold no end-of-document token, its last target may be one; after MAX_DRAWS draws the batch fails,
naming the fix (documents shorter than a window cannot give one).

Under context parallel each rank keeps the columns of its positions (`columns`: config.layout.cp_chunks, two of
the 2 x cp chunks of every window), so a row's tokens are the same whatever the cp size, split only.

While a training step computes, a background thread reads the next step's batch (a pure function, so reading
ahead changes nothing but when the bytes are read); evaluation batches are read when asked.
"""

from __future__ import annotations

from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path

import h5py
import numpy as np
import torch

from trainflow.data.index import Shard, read_index
from trainflow.data.mixture import assign
from trainflow.data.record import DataError, check_size

RERUN = "stage_data (snakemake --forcerun stage_data)"
MAX_DRAWS = 1000
"""Draws per row for a window inside one document (cross_document=False) before the batch is refused."""


class SourceTokens:
    """One source's shards, each split read as their concatenation."""

    def __init__(self, name: str, shards: list[Shard], *, seq_len: int) -> None:
        self.name, self.seq_len, self.files = name, seq_len, []
        for shard in shards:
            check_size(shard.path, rerun=RERUN)
            try:
                self.files.append(h5py.File(shard.path, "r"))
            except OSError as err:
                self.close()
                raise DataError(f"{shard.path} cannot be read as HDF5 ({err}); it is damaged: rerun {RERUN}") from err
        # Where each shard's tokens begin in the concatenated split: (shards + 1,) per split.
        self.offsets = {}
        for split in ("train", "val"):
            self.offsets[split] = np.concatenate([[0], np.cumsum([len(f[split]) for f in self.files])])
            if self.offsets[split][-1] < seq_len + 2:
                self.close()
                raise DataError(
                    f"source {name}: split '{split}' has {self.offsets[split][-1]} tokens, fewer than "
                    f"model.seq_len({seq_len}) + 2; use a larger corpus or a smaller data.val_fraction"
                )

    def last(self, split: str) -> int:
        """The largest start of a window of seq_len + 1 tokens (exclusive bound of the draws)."""
        return int(self.offsets[split][-1]) - self.seq_len - 1

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

    def close(self) -> None:
        for f in self.files:
            f.close()


class TokenSampler:
    """Batches of (inputs, targets) windows from the sources of a token index, a pure function of (seed, step).
    `weights` gives each source's weight by name (data.sources); None: the index's one source, weight 1. `columns`:
    the positions of each window this rank keeps, in its order (context parallel); None: all."""

    def __init__(
        self,
        path: str | Path,
        *,
        seq_len: int,
        seed: int,
        cross_document: bool = True,
        weights: dict[str, float] | None = None,
        columns: list[int] | None = None,
    ) -> None:
        check_size(Path(path), rerun=RERUN)
        index = read_index(path, rerun=RERUN)
        shards = index.shard_files(Path(path).parent)
        self.eot_id = index.tokenizer.eot_id
        self.seq_len, self.seed, self.cross_document = seq_len, seed, cross_document
        self.columns = None if columns is None else torch.tensor(columns)
        self.names = [s.name for s in index.sources]
        if weights is None and len(self.names) == 1:
            weights = {self.names[0]: 1.0}
        if weights is None or sorted(weights) != sorted(self.names):
            raise DataError(
                f"{path} holds the sources {', '.join(self.names)} but data.sources names "
                f"{', '.join(weights or ['none'])}: it was staged for another mixture; rerun {RERUN}"
            )
        self.weights = [float(weights[name]) for name in self.names]
        self.reader = ThreadPoolExecutor(max_workers=1, thread_name_prefix="prefetch")
        self.ahead: tuple[tuple, Future] | None = None
        self.sources: list[SourceTokens] = []
        try:
            for name in self.names:
                self.sources.append(SourceTokens(name, [s for s in shards if s.source == name], seq_len=seq_len))
        except DataError:
            self.close()
            raise

    def batch(
        self, split: str, index: int, global_batch: int, rows: slice, *, source: int | None = None
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Rows `rows` of the global batch number `index` of `split` (of the mixture, or of source number
        `source` alone): (B, T) inputs and targets (T: this rank's columns). A training batch starts the read of
        the next one in the background."""
        if split == "train" and source is None:  # an evaluation between two steps leaves the next read running
            key = (index, global_batch, rows.start, rows.stop, rows.step)
            ahead, self.ahead = self.ahead, None
            hit = ahead is not None and ahead[0] == key
            windows = ahead[1].result() if hit else self.windows(split, index, global_batch, rows)
            after = (index + 1, global_batch, rows.start, rows.stop, rows.step)
            self.ahead = (after, self.reader.submit(self.windows, split, index + 1, global_batch, rows))
        else:
            windows = self.windows(split, index, global_batch, rows, source)
        window = torch.from_numpy(windows)
        inputs, targets = window[:, :-1], window[:, 1:]
        if self.columns is not None:
            return inputs[:, self.columns], targets[:, self.columns]
        return inputs, targets

    def rows_of(self, index: int, global_batch: int) -> np.ndarray:
        """The source of each row of the mixture's global batch number `index` (data.mixture)."""
        return assign(self.weights, seed=self.seed, window=index, rows=global_batch)

    def windows(self, split: str, index: int, global_batch: int, rows: slice, source: int | None = None) -> np.ndarray:
        """The (B, T + 1) token windows of those rows."""
        split_id = 0 if split == "train" else 1
        which = self.rows_of(index, global_batch) if source is None else np.full(global_batch, source)
        lasts = np.array([s.last(split) for s in self.sources])[which]  # each row's bound, its source's
        if self.cross_document:
            # Every rank draws the whole global batch and keeps its rows: dp sizes share one stream.
            starts = np.random.default_rng((self.seed, split_id, index)).integers(0, lasts)
            picked = [(which[r], int(starts[r])) for r in range(global_batch)[rows]]
            return np.stack([self.sources[k].read(split, s, self.seq_len + 1) for k, s in picked]).astype(np.int64)
        picked = [(which[r], (self.seed, split_id, index, r)) for r in range(global_batch)[rows]]
        return np.stack([self.inside_one_document(split, k, stream) for k, stream in picked]).astype(np.int64)

    def inside_one_document(self, split: str, source: int, stream: tuple[int, ...]) -> np.ndarray:
        """A window of `source` whose inputs hold no end-of-document token, drawn from its own random stream."""
        rng, tokens = np.random.default_rng(stream), self.sources[source]
        for _ in range(MAX_DRAWS):
            window = tokens.read(split, int(rng.integers(0, tokens.last(split))), self.seq_len + 1)
            if not (window[:-1] == self.eot_id).any():
                return window
        raise DataError(
            f"no window of model.seq_len({self.seq_len}) + 1 tokens inside one document of split '{split}' of "
            f"source {self.names[source]} in {MAX_DRAWS} draws: the documents are shorter than a window; set "
            "train.cross_document=true or lower model.seq_len"
        )

    def close(self) -> None:
        self.reader.shutdown(wait=True, cancel_futures=True)
        for source in self.sources:
            source.close()
