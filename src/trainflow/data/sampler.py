"""The pure-function batch sampler over the token shards of a corpus or a mixture of them (data.index, data.tokens'
layout).

    python -c "from trainflow.data.sampler import TokenSampler; print(TokenSampler('index.json', seq_len=16, seed=0))"

Each source's split is read as the concatenation of its shards' datasets in index order. A training row is sample k of
its source (data.stream: the step's rows, each row's source and its position there), and its window starts at a token
position of that source drawn from (seed, k): the draws come in blocks of the stream's `block` positions, one random
generator per block (and per source, where there are several), so a run whose batch never changed draws exactly the
windows trainflow drew per step before positions. So the batch of a step is a function of the seed, the weights, the
shards' token counts and the stream's position alone, whatever the layout, and a resumed run needs only the position.
An evaluation reads batch i of one source's validation split (`evaluation`).

With cross_document=False (train.cross_document) a window may not run over an end-of-document token into the
next document: each row's start is re-drawn (from its own stream of (seed, split, block, row)) until its
inputs hold no end-of-document token, its last target may be one; after MAX_DRAWS draws the batch fails,
naming the fix (documents shorter than a window cannot give one).

Under context parallel each rank keeps the columns of its positions (`columns`: config.layout.cp_chunks, two of
the 2 x cp chunks of every window), so a row's tokens are the same whatever the cp size, split only.

While a training step computes, a background thread reads the next step's batch (a pure function, so reading
ahead changes nothing but when the bytes are read); evaluation batches are read when asked.
"""

from __future__ import annotations

import zlib
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path

import h5py
import numpy as np
import torch

from trainflow.data.index import Shard, read_index
from trainflow.data.record import DataError, check_size
from trainflow.data.stream import StepRows

RERUN = "stage_data (snakemake --forcerun stage_data)"
MAX_DRAWS = 1000
"""Draws per row for a window inside one document (cross_document=False) before the batch is refused."""
KEPT_BLOCKS = 64
"""Blocks of window starts kept drawn (a step's rows fall in a block or two of each source)."""


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
        self.drawn: dict[tuple[int, int, int], np.ndarray] = {}
        self.ahead: tuple[tuple, Future] | None = None
        self.sources: list[SourceTokens] = []
        try:
            for name in self.names:
                self.sources.append(SourceTokens(name, [s for s in shards if s.source == name], seq_len=seq_len))
        except DataError:
            self.close()
            raise

    def train(
        self, step: StepRows, rows: slice, *, block: int, ahead: StepRows | None = None
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Rows `rows` of a training step (data.stream's StepRows, in draw blocks of `block`): (B, T) inputs and targets
        (T: this rank's columns). `ahead`, the next step's rows, is read in the background meanwhile."""
        key = (step.start, step.end, rows.start, rows.stop, rows.step)
        held, self.ahead = self.ahead, None
        windows = held[1].result() if held is not None and held[0] == key else self.train_windows(step, rows, block)
        if ahead is not None:
            after = (ahead.start, ahead.end, rows.start, rows.stop, rows.step)
            self.ahead = (after, self.reader.submit(self.train_windows, ahead, rows, block))
        return self.split(windows)

    def evaluation(
        self, index: int, global_batch: int, rows: slice, *, source: int = 0
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Rows `rows` of validation batch `index` of source number `source` (global_batch rows drawn together)."""
        tokens = self.sources[source]
        if self.cross_document:
            starts = np.random.default_rng((self.seed, 1, index)).integers(0, tokens.last("val"), size=global_batch)
            picked = [tokens.read("val", int(starts[r]), self.seq_len + 1) for r in range(global_batch)[rows]]
        else:
            streams = [(self.seed, 1, index, r) for r in range(global_batch)[rows]]
            picked = [self.inside_one_document("val", source, stream) for stream in streams]
        return self.split(np.stack(picked).astype(np.int64))

    def split(self, windows: np.ndarray) -> tuple[torch.Tensor, torch.Tensor]:
        window = torch.from_numpy(windows)
        inputs, targets = window[:, :-1], window[:, 1:]
        if self.columns is not None:
            return inputs[:, self.columns], targets[:, self.columns]
        return inputs, targets

    def stream_key(self, source: int, *key: int) -> tuple[int, ...]:
        """A training draw's random stream: (seed, 0, block, ...) and, where there are several sources, the source's
        name's (so adding a source moves no other's windows); one source keeps the key it had before mixtures."""
        named = (zlib.crc32(self.names[source].encode()),) if len(self.names) > 1 else ()
        return (self.seed, 0, *key, *named)

    def starts(self, source: int, block_index: int, block: int) -> np.ndarray:
        """The window starts of one block of a source's positions, drawn once and kept (KEPT_BLOCKS)."""
        key = (source, block_index, block)
        if (starts := self.drawn.get(key)) is None:  # the prefetch thread draws too: one lookup, no KeyError
            if len(self.drawn) >= KEPT_BLOCKS:
                self.drawn.clear()
            rng = np.random.default_rng(self.stream_key(source, block_index))
            starts = self.drawn[key] = rng.integers(0, self.sources[source].last("train"), size=block)
        return starts

    def train_windows(self, step: StepRows, rows: slice, block: int) -> np.ndarray:
        """The (B, T + 1) token windows of those rows of the step."""
        picked = []
        for k, position in zip(step.sources[rows], step.positions[rows]):
            b, j = divmod(int(position), block)
            if self.cross_document:
                start = int(self.starts(int(k), b, block)[j])
                picked.append(self.sources[k].read("train", start, self.seq_len + 1))
            else:
                picked.append(self.inside_one_document("train", int(k), self.stream_key(int(k), b, j)))
        return np.stack(picked).astype(np.int64)

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
