"""The pure-function batch sampler over a corpus's token shards (data.index, data.tokens' layout).

    python -c "from trainflow.data.sampler import TokenSampler; print(TokenSampler('index.json', seq_len=16, seed=0))"

Each split is read as the concatenation of the shards' datasets in index order: a window starts at a global
token position drawn from (seed, split, step), and may run from one shard into the next. So the batch for
(step, rank) is a function of the seed and the shards' token counts alone (one shard reads exactly as the
single token file did), and a resumed run needs only the step to continue the same data order.
"""

from __future__ import annotations

from pathlib import Path

import h5py
import numpy as np
import torch

from trainflow.data.index import read_index
from trainflow.data.record import DataError, check_size

RERUN = "stage_data (snakemake --forcerun stage_data)"


class TokenSampler:
    """Batches of (inputs, targets) windows from the shards of a token index, a pure function of (seed, step)."""

    def __init__(self, path: str | Path, *, seq_len: int, seed: int) -> None:
        check_size(Path(path), rerun=RERUN)
        _, shards = read_index(path, rerun=RERUN)
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
        """Rows `rows` of the global batch number `index` of `split`: (B, T) inputs and targets."""
        total = int(self.offsets[split][-1])
        rng = np.random.default_rng((self.seed, 0 if split == "train" else 1, index))
        starts = rng.integers(0, total - self.seq_len - 1, size=global_batch)[rows]
        windows = np.stack([self.read(split, int(s), self.seq_len + 1) for s in starts]).astype(np.int64)  # (B, T+1)
        window = torch.from_numpy(windows)
        return window[:, :-1], window[:, 1:]

    def close(self) -> None:
        for f in self.files:
            f.close()
