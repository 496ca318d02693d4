"""Sharded data parallel keeps 1/dp of the state: two gloo ranks train the tiny model one step under DDP
(replicate) and under FSDP2 (shard), walk the storages behind their parameters, gradients and AdamW state,
and compare them with each other and with trainflow.plan.memory's estimate."""

from __future__ import annotations

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch.distributed.device_mesh import init_device_mesh

from tests.support import free_port
from trainflow.config import ParallelDims, compose
from trainflow.model import Llama, cross_entropy
from trainflow.parallel.data_parallel import apply_ddp, apply_fsdp
from trainflow.plan.memory import device_memory
from trainflow.plan.setup import model_counts
from trainflow.tensors import local
from trainflow.train.controls import build_optimizer

WORLD = 2
MODES = ("replicate", "shard")


def state_bytes(mode: str, mesh) -> int:
    """Bytes of the distinct storages behind this rank's parameters, gradients and AdamW state after one step."""
    cfg = compose("train_segment", [])
    torch.manual_seed(0)
    model = Llama(cfg.model)
    if mode == "shard":
        apply_fsdp([model], mesh, compute_dtype=torch.float32, pipelined=False)
    else:
        model = apply_ddp(model, mesh, bucket_mb=25)
    opt = build_optimizer(model, cfg.optim, torch.device("cpu"))
    x, y = torch.randint(0, cfg.model.vocab_size, (2, 1, 16))
    cross_entropy(model(x), y).backward()
    opt.step()
    params = list(model.parameters())
    tensors = params + [p.grad for p in params] + [t for s in opt.state.values() for t in s.values()]
    storages = {local(t).untyped_storage().data_ptr(): local(t).untyped_storage().nbytes() for t in tensors}
    return sum(storages.values())


def rank_main(rank: int, port: int, results) -> None:
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=WORLD)
    try:
        mesh = init_device_mesh("cpu", (WORLD,), mesh_dim_names=("dp",))
        results.put((rank, {mode: state_bytes(mode, mesh) for mode in MODES}))
    finally:
        dist.destroy_process_group()


def test_shard_keeps_half_the_state_of_replicate_at_dp2():
    port = free_port()
    results = mp.get_context("spawn").SimpleQueue()
    mp.spawn(rank_main, args=(port, results), nprocs=WORLD, join=True)
    measured = dict(results.get() for _ in range(WORLD))
    m = compose("train_segment", []).model
    for rank, state in measured.items():
        for mode in MODES:
            dims = ParallelDims(dp=WORLD, tp=1, pp=1, world_size=WORLD, dp_mode=mode)
            e = device_memory(
                m,
                dims,
                counts=model_counts(m, dims),
                microbatch_size=1,
                precision="fp32",
                activations="keep",
            )
            estimated = e.parameters + e.gradients + e.optimizer_state
            # FSDP pads each parameter to whole rows per rank (the vocabulary's 257): within a few kB.
            assert abs(state[mode] / estimated - 1) < 1e-3, f"rank {rank} {mode}: {state[mode]} vs {estimated} bytes"
        assert abs(state["shard"] / state["replicate"] - 1 / WORLD) < 1e-3, f"rank {rank}: {state}"
