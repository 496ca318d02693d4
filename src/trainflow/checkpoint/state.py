"""What a checkpoint holds: model and optimizer tensors keyed like the single-device model, step, RNG.

Keys are the fully qualified names of the unwrapped model (no DDP prefix, the global layer index
under pipeline parallelism), and DTensor shards stay DTensors, so DCP can reshard a checkpoint into
another layout. The optimizer's param_groups (lr, betas, ...) are left out: they come from the
config and the learning-rate schedule, and DCP would pickle each of them separately per parameter
(935 items for a small decoder, which tripled save time in benchmarks/checkpoint.py).
"""

from __future__ import annotations

import hashlib

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.checkpoint.state_dict import (
    StateDictOptions,
    get_model_state_dict,
    get_optimizer_state_dict,
    set_model_state_dict,
    set_optimizer_state_dict,
)
from torch.distributed.tensor import DTensor

from trainflow.tensors import local

FLAT = StateDictOptions(flatten_optimizer_state_dict=True)
FP8_STATE = ".amax_history"
"""The delayed fp8 recipe's scaling state beside a block linear (trainflow.fp8): training state, neither exported
nor imported from Hugging Face (a DCP load reads only the keys asked for)."""
TIED_HEAD, TIED_EMBEDDING = "state.output.weight.", "state.tok_embeddings.weight."
"""A tied head's AdamW state on the last pipeline stage, and the key it is saved under (both ends' copies step alike,
so the two ranks write the same tensor under one key, which DCP writes once)."""


def saved_key(part: nn.Module, key: str) -> str:
    """The checkpoint's key of an optimizer state entry: a tied head's copy on a pipeline stage without the
    embedding (trainflow.parallel.pipeline) saves and loads as the embedding's, the one key one process has."""
    if getattr(part, "tie_embeddings", False) and part.tok_embeddings is None and key.startswith(TIED_HEAD):
        return TIED_EMBEDDING + key.removeprefix(TIED_HEAD)
    return key


def build_state(parts: list[nn.Module], optimizers: list[torch.optim.Optimizer], *, step: int = 0) -> dict:
    model, optim = {}, {}
    for part, opt in zip(parts, optimizers):
        model.update(get_model_state_dict(part, options=FLAT))
        optim.update(
            {
                saved_key(part, k): v
                for k, v in get_optimizer_state_dict(part, opt, options=FLAT).items()
                if not k.startswith("param_groups.")
            }
        )
    return {"model": model, "optim": optim, "step": torch.tensor(step), "rng": torch.get_rng_state()}


def state_bytes(parts: list[nn.Module]) -> int:
    """This rank's bytes of what build_state holds once AdamW's two moments exist, counted without making them
    (get_optimizer_state_dict takes a zero step to make them, which would change a fresh run's first step): the
    model's state and two copies of its parameters. What checkpoint.mode=async stages in host memory."""
    tensors = [t for part in parts for t in part.state_dict().values() if isinstance(t, torch.Tensor)]
    params = [p for part in parts for p in part.parameters()]
    return sum(local(t).nbytes for t in tensors) + 2 * sum(local(p).nbytes for p in params)


def load_state(parts: list[nn.Module], optimizers: list[torch.optim.Optimizer], state: dict) -> int:
    """Copy a loaded state into the model chunks and optimizers; returns its step."""
    for part, opt in zip(parts, optimizers):
        set_model_state_dict(part, state["model"], options=StateDictOptions(strict=False))
        live = get_optimizer_state_dict(part, opt, options=FLAT)  # param_groups as configured
        live.update({k: state["optim"][saved_key(part, k)] for k in live if saved_key(part, k) in state["optim"]})
        set_optimizer_state_dict(part, opt, live, options=FLAT)
    torch.set_rng_state(state["rng"])
    return int(state["step"])


def state_digest(state: dict) -> list[str]:
    """SHA-256 of this rank's local model and optimizer tensors, gathered from every rank: equal lists are bitwise
    equal runs (the segment summary's state_digest)."""
    h = hashlib.sha256()
    for section in ("model", "optim"):
        for key, value in sorted(state[section].items()):
            if isinstance(value, torch.Tensor):
                local = value.to_local() if isinstance(value, DTensor) else value
                h.update(key.encode())
                h.update(local.detach().cpu().contiguous().reshape(-1).view(torch.uint8).numpy().tobytes())
    digests: list[str] = [""] * dist.get_world_size()
    dist.all_gather_object(digests, h.hexdigest())
    return digests
