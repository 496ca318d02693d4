"""The pure-function batch sampler over a token file (data.tokens' layout).

    python -c "from trainflow.data.sampler import TokenSampler; print(TokenSampler('tokens.h5', seq_len=16, seed=0))"

The batch for (step, rank) is a function of the seed alone, so a resumed run needs only the step to
continue the same data order.
"""

from __future__ import annotations

from pathlib import Path

import h5py
import numpy as np
import torch

from trainflow.data.record import DataError, check_size


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
