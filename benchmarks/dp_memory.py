"""Data-parallel memory: the peak bytes of a rank at dp=4, replicated (DDP) vs sharded (FSDP2), measured
and as trainflow.plan.memory estimates them.

    python benchmarks/dp_memory.py [--quick]

Goal: at dp=4 sharding keeps <= 0.4 x replication's parameters + gradients + AdamW state per rank
(ZeRO-3's ideal is 1/dp = 0.25; the rest of the budget is FSDP's padding and whatever it keeps whole).

Ranks are spawned gloo processes on 127.0.0.1, one thread each, and train fp32. The model is a trainflow
Llama of 8 layers, d=512, 8 heads (no grouping), SwiGLU 1408, vocabulary 256 (26 M parameters, 99 MB
fp32; --quick: 2 layers of d=256 at dp=2) on 1 x 64 tokens per rank, so parameters, gradients and AdamW's two moments
(16 bytes per parameter) dwarf the activations. Every rank builds the model from the same seed and
applies what trainflow does on a pure-dp mesh: `apply_ddp` (replicate) or `apply_fsdp` (shard), then
builds AdamW with `build_optimizer` and runs two steps (zero_grad, forward, loss, backward, AdamW step);
AdamW makes its state at the first, so the second is a steady step.

Measured, per rank:
- peak: the most resident memory the rank reached while it built the model and ran the two steps,
  above what it held before: the kernel's high-water mark (VmHWM, reset through /proc/self/clear_refs).
  glibc runs with MALLOC_MMAP_THRESHOLD_=65536, so every block of 64 KiB or more is its own mapping,
  returned to the kernel when freed; by default glibc raises that threshold as blocks are freed and
  keeps freed memory in its heap, where the resident size stops following the tensors. Each rank runs
  the whole thing twice and reports the second: the first touches code and sets up gloo's buffers
  (15-20 MB, once). Not torch's profiler (trainflow.plan.peak): DDP's and FSDP2's collectives drop
  tensors on gloo's threads, where it records no free, and its allocator total came out 12-73 MB too
  high under FSDP (differently on every rank) and 99 MB too low under DDP.
- state: the bytes of the storages behind the parameters, their gradients and AdamW's state, walked
  after the second step's backward (a DTensor counts its local shard; FSDP's padded shard storage is
  counted whole).
The worst rank is reported. Estimated: `device_memory` of the same layout (microbatch_size 1, fp32,
activations kept, device cpu); its parameters + gradients + optimizer_state are compared with the
measured state, its total with the peak. The estimate leaves out, by design (trainflow.plan.memory),
DDP's buckets (a second fp32 copy of the gradients as apply_ddp builds DDP) and foreach AdamW's
temporary (one fp32 copy of the rank's parameters, CPU only), which set replicate's peak here, the
activations being small.
"""

from __future__ import annotations

import argparse
import gc
import os
from pathlib import Path

import torch
from _common import bench_model, emit, log, run_ranks
from torch.distributed.device_mesh import init_device_mesh

from trainflow.config import ParallelDims, compose
from trainflow.config.shape import total_params
from trainflow.model import Llama, cross_entropy
from trainflow.parallel.data_parallel import apply_ddp, apply_fsdp
from trainflow.parallel.grad_reducer import local
from trainflow.plan.memory import device_memory
from trainflow.plan.setup import model_counts
from trainflow.train.controls import build_optimizer

MODEL = dict(vocab_size=256, n_layers=8, n_heads=8, dim=512, seq_len=64)
DP = 4
MODES = ("replicate", "shard")
GOAL = 0.4
MB = 2**20
MMAP_THRESHOLD = 64 * 1024
"""glibc's MALLOC_MMAP_THRESHOLD_ for the ranks: blocks this size and up are mapped and unmapped one by one."""


def status_bytes(field: str) -> int:
    """A memory field of /proc/self/status (VmRSS, VmHWM), in bytes."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(f"{field}:"):
            return int(line.split()[1]) * 1024  # the kernel reports kB
    raise KeyError(f"{field} is not in /proc/self/status; this benchmark needs Linux")


def storage_bytes(tensors: list[torch.Tensor]) -> int:
    """Bytes of the distinct storages behind `tensors` (a DTensor's local shard; views counted once)."""
    storages = {}
    for t in tensors:
        s = local(t).untyped_storage()
        storages[s.data_ptr()] = s.nbytes()
    return sum(storages.values())


def two_steps(mode: str, shape: dict, dp_mesh, x: torch.Tensor, y: torch.Tensor) -> int:
    """Build, parallelize and train the model two steps; the state bytes after the second backward."""
    torch.manual_seed(0)  # identical replicas, as after the broadcast of a real run
    model = Llama(bench_model(**shape))
    if mode == "shard":
        apply_fsdp([model], dp_mesh, compute_dtype=torch.float32, pipelined=False)
    else:
        model = apply_ddp(model, dp_mesh, bucket_mb=25)
    opt = build_optimizer(model, compose("train_segment", []).optim, torch.device("cpu"))
    for _ in range(2):
        opt.zero_grad(set_to_none=True)
        cross_entropy(model(x), y).backward()
        params = list(model.parameters())
        moments = [t for s in opt.state.values() for t in s.values()]
        state = storage_bytes(params + [p.grad for p in params if p.grad is not None] + moments)
        opt.step()
    return state


def rank_fn(rank: int, world: int, modes: tuple[str, ...], shape: dict) -> dict[str, dict]:
    """Each mode's, in turn: this rank's peak resident bytes over building the model and two steps, its state bytes."""
    dp_mesh = init_device_mesh("cpu", (world,), mesh_dim_names=("dp",))
    torch.manual_seed(1 + rank)  # a different batch per dp rank
    x, y = torch.randint(0, shape["vocab_size"], (2, 1, shape["seq_len"]))
    out = {}
    for mode in modes:
        for _ in range(2):  # the second run is measured: the first touches code and gloo's buffers for good
            gc.collect()  # the first run's model: DDP's and FSDP's hooks hold it in reference cycles
            Path("/proc/self/clear_refs").write_text("5")  # VmHWM restarts from the current VmRSS
            before = status_bytes("VmRSS")
            state = two_steps(mode, shape, dp_mesh, x, y)
            peak = status_bytes("VmHWM") - before
        out[mode] = {"peak": peak, "state": state}
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument(
        "--quick",
        action="store_true",
        help="dp=2 instead of 4, 2 layers of d=256 instead of 8 of d=512, both modes in one world of ranks",
    )
    args = ap.parse_args()
    os.environ["MALLOC_MMAP_THRESHOLD_"] = str(MMAP_THRESHOLD)  # read by glibc as each rank starts
    shape, dp = (MODEL | {"n_layers": 2, "dim": 256}, 2) if args.quick else (MODEL, DP)
    m = bench_model(**shape)
    by_mode = {}
    for modes in [MODES] if args.quick else [(mode,) for mode in MODES]:
        log(f"dp_memory: dp={dp} {' then '.join(modes)}")
        ranks = run_ranks(rank_fn, dp, modes, shape)
        by_mode |= {mode: [r[mode] for r in ranks] for mode in modes}
    rows, measured = {}, {}
    for mode, ranks in by_mode.items():
        dims = ParallelDims(dp=dp, tp=1, pp=1, world_size=dp, dp_mode=mode)
        e = device_memory(
            m,
            dims,
            counts=model_counts(m, dims),
            microbatch_size=1,
            precision="fp32",
            activations="keep",
            device="cpu",
        )
        peak, state = measured[mode] = max(r["peak"] for r in ranks), max(r["state"] for r in ranks)
        estimated_state = e.parameters + e.gradients + e.optimizer_state
        rows[mode] = {
            "measured_mb": {"peak": round(peak / MB, 1), "state": round(state / MB, 1)},
            "peak_by_rank_mb": [round(r["peak"] / MB, 1) for r in ranks],
            "estimated_mb": {
                "total": round(e.total / MB, 1),
                "state": round(estimated_state / MB, 1),
                "gathered": round(e.gathered / MB, 1),
                "activations": round(e.activations / MB, 1),
            },
            "estimated_over_measured": {"total": round(e.total / peak, 3), "state": round(estimated_state / state, 3)},
        }
    (rep_peak, rep_state), (shard_peak, shard_state) = measured["replicate"], measured["shard"]
    state_ratio, peak_ratio = shard_state / rep_state, shard_peak / rep_peak
    emit(
        {
            "benchmark": "dp_memory",
            "model": {**shape, "params": total_params(m), "tokens_per_rank": shape["seq_len"]},
            "dp": dp,
            "modes": rows,
            "shard_over_replicate": {"state": round(state_ratio, 3), "peak": round(peak_ratio, 3)},
            "goal": {"target": f"shard / replicate state <= {GOAL} at dp={dp}", "met": state_ratio <= GOAL},
        }
    )


if __name__ == "__main__":
    main()
