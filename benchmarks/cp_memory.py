"""Context-parallel activation memory: the peak a rank allocates in one forward and backward at cp2 against cp1, at
the same sequence length, measured and as trainflow.plan.memory estimates them.

    python benchmarks/cp_memory.py [--quick] [--seq 2048]

Goal: peak activation memory per rank at cp2 <= 0.6 x cp1's (the ideal is 0.5: each cp rank holds half of every
sequence; what it holds beyond that is the whole sequence's gathered K and V, per layer, and the (T / cp, T) mask).

Ranks are spawned gloo processes, one thread each, fp32, activations kept. The model is the tiny Llama (4 layers,
d=128, 4 / 2 heads, vocabulary 257) at seq 2048 (--quick: 256), batch 2, parallelized by trainflow's own
`parallelize_model` on `build_mesh(ParallelDims(cp=...))`: at cp1 one process (--quick: the benchmark's own, which
saves a process's start), at cp2 two, each given its chunks of the same two sequences (config.layout.cp_chunks).
Measured: the most memory the forward, loss and backward allocate above what was held before (trainflow.plan.peak,
torch's profiler: the activations saved for backward, the gradients, the gathers' buffers), the median of 3 calls
(--quick: 1), the worst rank. A block gloo frees on its own threads counts as freed only when its address is taken
again (plan.peak's note), so cp2's figure is an upper bound.
"""

from __future__ import annotations

import argparse

import torch
from _common import emit, log, median, run_here, run_ranks

from trainflow.config import ParallelDims, compose
from trainflow.config.layout import cp_chunks
from trainflow.model import Llama, cross_entropy
from trainflow.parallel import parallelize_model
from trainflow.parallel.mesh import build_mesh
from trainflow.plan.memory import device_memory
from trainflow.plan.peak import peak_bytes
from trainflow.plan.setup import model_counts

BATCH = 2
GOAL = 0.6
MB = 1e6


def rank_fn(rank: int, world: int, seq: int, calls: int) -> int:
    """This rank's peak bytes of a forward and backward of the tiny Llama, its cp chunks of two sequences."""
    m = compose("train_segment", ["model=tiny", f"model.seq_len={seq}"]).model
    dims = ParallelDims(dp=1, tp=1, pp=1, cp=world, world_size=world)
    mesh = build_mesh(dims, "cpu")
    torch.manual_seed(0)
    model = Llama(m)
    par = parallelize_model(
        model, dims, mesh, loss_fn=cross_entropy, device=torch.device("cpu"), bucket_mb=25, overlap=True
    )
    x, y = torch.randint(0, m.vocab_size, (2, BATCH, seq))
    columns = torch.tensor(cp_chunks(seq, world, rank))
    x, y = x[:, columns], y[:, columns]

    def step() -> None:
        par.forward_backward(x, y)
        for p in model.parameters():
            p.grad = None

    step()  # the allocator and the groups warm up
    return int(median([peak_bytes(step) for _ in range(calls)]))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument(
        "--quick",
        action="store_true",
        help="seq 256 instead of 2048, 1 measured call instead of 3, cp1 in this process",
    )
    ap.add_argument("--seq", type=int, default=2048, help="tokens per sequence (divisible by 4)")
    args = ap.parse_args()
    seq, calls = (256, 1) if args.quick else (args.seq, 3)
    m = compose("train_segment", ["model=tiny", f"model.seq_len={seq}"]).model
    peaks, rows = {}, {}
    for cp in (1, 2):
        log(f"cp_memory: cp{cp}, batch {BATCH} x seq {seq}")
        ranks = run_here(rank_fn, seq, calls) if cp == 1 and args.quick else run_ranks(rank_fn, cp, seq, calls)
        peaks[cp] = max(ranks)
        dims = ParallelDims(dp=1, tp=1, pp=1, cp=cp, world_size=cp)
        e = device_memory(
            m,
            dims,
            counts=model_counts(m, dims),
            microbatch_size=BATCH,
            precision="fp32",
            activations="keep",
            device="cpu",
        )
        rows[f"cp{cp}"] = {
            "peak_mb": round(peaks[cp] / MB, 2),
            "peak_by_rank_mb": [round(r / MB, 2) for r in ranks],
            "estimate_activations_mb": round(e.activations / MB, 2),
        }
    ratio = peaks[2] / peaks[1]
    estimated = rows["cp2"]["estimate_activations_mb"] / rows["cp1"]["estimate_activations_mb"]
    emit(
        {
            "benchmark": "cp_memory",
            "model": {"name": m.name, "batch": BATCH, "seq": seq},
            "precision": "fp32",
            "threads": 1,
            "layouts": rows,
            "cp2_over_cp1": {"measured": round(ratio, 3), "estimated": round(estimated, 3)},
            "goal": {"target": f"cp2 / cp1 peak activation memory per rank <= {GOAL}", "met": ratio <= GOAL},
        }
    )


if __name__ == "__main__":
    main()
