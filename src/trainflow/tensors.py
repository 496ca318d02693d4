"""A rank's part of a tensor, plain or DTensor: what the gradient reducer, FP8's histories, the activation modes,
checkpoint staging and the Hugging Face import read and write in place.

    local(param).numel()          # this rank's elements of a (maybe tp- or FSDP-sharded) parameter
    storage_ptr(a) == storage_ptr(b)   # the same memory, whether DTensor or not
"""

from __future__ import annotations

import torch
from torch.distributed.tensor import DTensor


def local(t: torch.Tensor) -> torch.Tensor:
    """This rank's tensor of a DTensor (its local shard, the same storage), else `t`. The shard itself, without the
    autograd node `to_local()` adds where grad is on: every caller reads or writes the data, none differentiates
    through it."""
    return t._local_tensor if isinstance(t, DTensor) else t


def storage_ptr(t: torch.Tensor) -> int:
    """Where the memory under `t` (its local shard's, for a DTensor) begins: equal for tensors sharing storage."""
    return local(t).untyped_storage().data_ptr()
