"""Gradient buckets: the replicated data-parallel step with per-parameter all-reduce, GradReducer's buckets
(after backward or overlapped with it) and torch's DDP, at dp=4.

    python benchmarks/grad_buckets.py [--quick]

Goal: at dp=4 and the config's 25 MB buckets, GradReducer overlapped with backward gains at least 0.9x
what DDP gains over per-parameter all-reduce, and at least what GradReducer gains without overlap. The
gains are speedups over one baseline, GradReducer's bucket_mb=0 after backward (one all-reduce per
parameter once backward is done), so the criteria read step(DDP) / step(overlap) >= 0.9 and
step(after backward) / step(overlap) >= 1. DDP's own per-parameter row (bucket_cap_mb=0) is reported too.

Ranks are spawned gloo processes on 127.0.0.1, one thread each. The model is a trainflow Llama of 12
layers, d=256, 4 heads (no grouping), SwiGLU 704 (9.8 M parameters, 111 tensors, 37 MiB of fp32
gradients) on a small batch (1 x 64 tokens per rank), so the gradient exchange is a large part of the
step, as it is at scale. A step is what the trainer and `Parallelized` run around the optimizer:
`zero_grad(set_to_none=True)` (then `GradReducer.zero_grad()`, which points the gradients back into its
buckets) + forward + backward + `GradReducer.finish()`; its time is the slowest rank's. Every variant has
its own model (GradReducer's overlap hooks stay on the parameters) and the variants take turns within
each repeat, in a rotating order. This machine is shared (2 cores, other work running), so ratios are
paired: the median over repeats of one variant's step over another's in the same repeat, which cancels
load drift between repeats; the medians and minima of the step times are reported beside them.
"""

from __future__ import annotations

import argparse
import time

import torch
import torch.distributed as dist
from _common import bench_model, emit, log, median, run_ranks
from torch.nn.parallel import DistributedDataParallel

from trainflow.model import Llama, cross_entropy
from trainflow.parallel.grad_reducer import GradReducer

MODEL = dict(vocab_size=256, n_layers=12, n_heads=4, dim=256, seq_len=64)
DP = 4
BUCKET_MB = 25.0
"""The config default (parallel.bucket_mb), where the goal is judged."""
BASELINE = ("reducer", 0.0, False)
"""Per-parameter all-reduce after backward: every speedup is over this variant."""
REDUCER_AFTER = ("reducer", BUCKET_MB, False)
REDUCER_OVERLAP = ("reducer", BUCKET_MB, True)
DDP = ("ddp", BUCKET_MB, True)
VARIANTS = [BASELINE, REDUCER_AFTER, REDUCER_OVERLAP, ("ddp", 0.0, True), DDP]
"""(kind, bucket_mb, overlap); DDP always overlaps, and its 0 MB row is its own per-parameter all-reduce."""
DDP_SHARE = 0.9
"""The share of DDP's speedup that GradReducer with overlap must reach."""


def name(variant: tuple[str, float, bool]) -> str:
    kind, mb, overlap = variant
    return f"{kind}/{mb:g}MB/{'overlap' if overlap else 'after_backward'}"


def rank_fn(rank: int, world: int, repeats: int, shape: dict) -> dict:
    """Every variant's step seconds (slowest rank) per repeat, and how many buckets each launched in backward."""
    torch.manual_seed(1 + rank)  # a different batch per dp rank
    x = torch.randint(0, shape["vocab_size"], (1, shape["seq_len"]))
    y = torch.randint(0, shape["vocab_size"], (1, shape["seq_len"]))
    group = dist.group.WORLD
    runs = []
    for kind, mb, overlap in VARIANTS:
        torch.manual_seed(0)  # identical replicas, as after the broadcast of a real run
        model = Llama(bench_model(**shape))
        if kind == "ddp":
            runs.append((name((kind, mb, overlap)), DistributedDataParallel(model, bucket_cap_mb=mb), None))
        else:
            reducer = GradReducer(list(model.parameters()), group, bucket_mb=mb, overlap=overlap)
            runs.append((name((kind, mb, overlap)), model, reducer))
    times: dict[str, list[float]] = {n: [] for n, _, _ in runs}
    buckets: dict[str, dict[str, int]] = {}
    for r in range(1 + repeats):  # repeat 0 warms every variant up (DDP builds its buckets on step 1)
        shift = r % len(runs)  # rotate the order so no variant always follows the same neighbour
        for n, model, reducer in runs[shift:] + runs[:shift]:
            dist.barrier()
            t0 = time.perf_counter()
            model.zero_grad(set_to_none=True)
            if reducer is not None:
                reducer.zero_grad()
            cross_entropy(model(x), y).backward()
            if reducer is not None:
                buckets[n] = {"buckets": len(reducer.buckets), "launched_in_backward": reducer.next}
                reducer.finish()
            seconds = torch.tensor(time.perf_counter() - t0)
            dist.all_reduce(seconds, op=dist.ReduceOp.MAX)
            if r:
                times[n].append(float(seconds))
        if rank == 0:
            log(f"grad_buckets: dp={world} repeat {r}/{repeats} done")
    return {"times": times, "buckets": buckets}


def paired(times: dict[str, list[float]], slow: tuple, fast: tuple) -> float:
    """Median over repeats of step(slow) / step(fast) within the same repeat, so load drift between repeats cancels."""
    return median([a / b for a, b in zip(times[name(slow)], times[name(fast)])])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument(
        "--quick", action="store_true", help="dp=2 instead of 4, 4 layers instead of 12, 1 timed repeat instead of 30"
    )
    args = ap.parse_args()
    shape, dp, repeats = (MODEL | {"n_layers": 4}, 2, 1) if args.quick else (MODEL, DP, 30)
    log(f"grad_buckets: dp={dp}, {len(VARIANTS)} variants x {repeats} repeats")
    result = run_ranks(rank_fn, dp, repeats, shape)[0]
    times = result["times"]
    rows = []
    for v in VARIANTS:
        ts = times[name(v)]
        rows.append(
            {
                "impl": "trainflow.GradReducer" if v[0] == "reducer" else "torch.DDP",
                "bucket_mb": v[1],
                "overlap": v[2],
                "step_s": round(median(ts), 4),
                "step_min_s": round(min(ts), 4),
                "speedup": round(paired(times, BASELINE, v), 3),
                "speedup_min": round(min(times[name(BASELINE)]) / min(ts), 3),
                **result["buckets"].get(name(v), {}),
            }
        )
    over_ddp = paired(times, DDP, REDUCER_OVERLAP)
    over_after = paired(times, REDUCER_AFTER, REDUCER_OVERLAP)
    goal = {
        "target": f"at dp={dp}, {BUCKET_MB:g} MB: GradReducer with overlap >= {DDP_SHARE} x DDP's speedup over "
        "per-parameter all-reduce, and >= GradReducer after backward (paired medians)",
        "reducer_overlap_over_ddp": round(over_ddp, 3),
        "reducer_overlap_over_after_backward": round(over_after, 3),
        "met": over_ddp >= DDP_SHARE and over_after >= 1.0,
    }
    model = Llama(bench_model(**shape))
    n_params, n_tensors = model.num_params(), len(list(model.parameters()))
    emit(
        {
            "benchmark": "grad_buckets",
            "model": {
                **shape,
                "params": n_params,
                "tensors": n_tensors,
                "grad_mb": round(n_params * 4 / 2**20, 1),
                "tokens_per_rank": shape["seq_len"],
            },
            "dp": dp,
            "repeats": repeats,
            "baseline": name(BASELINE),
            "step": rows,
            "goal": goal,
        }
    )


if __name__ == "__main__":
    main()
