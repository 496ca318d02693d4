"""Activation memory: what each transformer block keeps for its backward pass (train.activations).

    apply_activations(parts, "recompute")          # or "keep", or "offload" [, folder]

- keep: everything autograd saves stays where it was made.
- recompute: torch's non-reentrant activation checkpointing per block: a block keeps its input and
  recomputes the rest during backward (one extra forward, no RNG in the model, so bitwise the same).
- offload: every saved tensor of a block moves to host memory (torch's save_on_cpu; pinned on CUDA),
  or, with a folder, to files on the fast tier and back when backward needs it. torch offers no
  disk offload, so OffloadToFolder is hand-written; weights and small tensors stay in memory.

The policy goes through the model's `run_block` hook, so parameter names, checkpoints and the tensor
parallel plan are the same in every mode.
"""

from __future__ import annotations

import contextlib
import functools
import itertools
import shutil
from collections.abc import Callable
from pathlib import Path

import numpy as np
import torch
from torch import nn
from torch.utils.checkpoint import checkpoint

from trainflow.errors import TrainflowError
from trainflow.model import call_block
from trainflow.tensors import storage_ptr

MIN_OFFLOAD_BYTES = 64 * 1024
"""Smaller saved tensors (norm statistics, scalars) stay in memory: a file each would cost more than they hold."""


class OffloadError(TrainflowError):
    """An offloaded activation could not be written or read back."""


def recompute_block(block: nn.Module, *args: torch.Tensor) -> torch.Tensor:
    return checkpoint(block, *args, use_reentrant=False)


def offload_block(hooks: Callable[[], contextlib.AbstractContextManager], block: nn.Module, *args: torch.Tensor):
    with hooks():
        return block(*args)


class OffloadToFolder:
    """saved_tensors_hooks that write each large saved activation to its own file and read it back once.

    Files are raw bytes named by a counter in a folder of this rank; the dtype, shape and device stay in
    memory, so a file is only ever read as the bytes this process wrote (its size is checked).
    """

    def __init__(self, folder: Path, parameters: list[torch.Tensor]) -> None:
        self.folder = folder
        shutil.rmtree(folder, ignore_errors=True)  # a crashed step's leftovers
        folder.mkdir(parents=True, exist_ok=True)
        self.counter = itertools.count()
        self.weights = {storage_ptr(p) for p in parameters}

    def hooks(self) -> torch.autograd.graph.saved_tensors_hooks:
        return torch.autograd.graph.saved_tensors_hooks(self.pack, self.unpack)

    def pack(self, t: torch.Tensor) -> object:
        if not self.offloads(t):
            return t
        path = self.folder / f"{next(self.counter)}.act"
        try:
            with open(path, "xb") as f:
                storage_bytes(t).cpu().numpy().tofile(f)
        except OSError as e:
            why = f"cannot write an activation to {path}: {e}; free space there or choose another train.offload_dir"
            raise OffloadError(why) from e
        return path, t.dtype, t.shape, t.stride(), t.device, t.nbytes

    def offloads(self, t: torch.Tensor) -> bool:
        """Large plain tensors that fill their storage exactly (so its bytes are the tensor, whatever its
        strides: compiled backward kernels expect the strides they saved); not the weights."""
        return (
            type(t) is torch.Tensor
            and t.nbytes >= MIN_OFFLOAD_BYTES
            and t.storage_offset() == 0
            and t.untyped_storage().nbytes() == t.nbytes
            and storage_ptr(t) not in self.weights
        )

    def unpack(self, packed: object) -> torch.Tensor:
        if isinstance(packed, torch.Tensor):
            return packed
        path, dtype, shape, stride, device, nbytes = packed
        data = torch.from_numpy(np.fromfile(path, dtype=np.uint8))
        path.unlink()
        if data.numel() != nbytes:
            raise OffloadError(
                f"{path} holds {data.numel()} bytes, not the {nbytes} written: the offload folder changed"
            )
        return torch.empty(0, dtype=dtype).set_(data.untyped_storage(), 0, shape, stride).to(device)

    def close(self) -> None:
        shutil.rmtree(self.folder, ignore_errors=True)


def storage_bytes(t: torch.Tensor) -> torch.Tensor:
    """The bytes of `t`'s whole storage, in memory order, as a flat uint8 tensor."""
    return torch.empty(0, dtype=torch.uint8, device=t.device).set_(t.untyped_storage())


def apply_activations(parts: list[nn.Module], mode: str, folder: Path | None = None) -> OffloadToFolder | None:
    """Set how every block of these model chunks keeps activations; the folder offloader to close, if any."""
    if mode == "keep":
        for part in parts:
            part.run_block = call_block
        return None
    if mode == "recompute":
        for part in parts:
            part.run_block = recompute_block
        return None
    params = [p for part in parts for p in part.parameters()]
    if folder is None:
        pin = any(p.device.type == "cuda" for p in params)
        hooks, offloader = functools.partial(torch.autograd.graph.save_on_cpu, pin_memory=pin), None
    else:
        offloader = OffloadToFolder(folder, params)
        hooks = offloader.hooks
    for part in parts:
        part.run_block = functools.partial(offload_block, hooks)
    return offloader
