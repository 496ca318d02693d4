"""Gradient buckets: data-parallel step time with per-parameter all-reduce vs bucketed, with and without overlap.

    python benchmarks/grad_buckets.py [--quick]

Goal: at dp=4, GradReducer's buckets >= 1.5x faster than per-parameter all-reduce (bucket_mb=0), i.e.
step(per-parameter) / step(bucketed) >= 1.5 at equal overlap. Judged at the config default (25 MB) and
at the best size; every size is reported, at dp=2 too.

Ranks are spawned gloo processes on 127.0.0.1, one thread each. The model is a trainflow Llama of 12
layers, d=256, 4 heads (no grouping), SwiGLU 704 (9.8 M parameters, 111 tensors, 37 MiB of fp32
gradients) on a small batch (1 x 64 tokens per rank), so the gradient exchange is a large part of the
step, as it is at scale. A step is zero_grad + forward + backward + `GradReducer.finish()` (the
optimizer is the same for every variant and left out); its time is the slowest rank's. Medians judge
the goal; minima are reported beside them, since other work on the machine only ever adds time. Every
variant has its own model (GradReducer's overlap hooks stay on the parameters) and the variants take
turns within each repeat, so load drift on this shared machine hits them alike. torch's DDP
(`bucket_cap_mb`, always overlapped) is the reference row; its 0 MB row is DDP's own per-parameter
baseline.
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
SIZES_MB = (0.25, 1.0, 4.0, 25.0)


def variants() -> list[tuple[str, float, bool]]:
    """(kind, bucket_mb, overlap): GradReducer per-parameter and bucketed, both overlap settings; DDP."""
    out = [("reducer", mb, overlap) for overlap in (False, True) for mb in (0.0, *SIZES_MB)]
    return out + [("ddp", mb, True) for mb in (0.0, *SIZES_MB)]


def name(kind: str, mb: float, overlap: bool) -> str:
    return f"{kind}/{mb:g}MB/{'overlap' if overlap else 'after_backward'}"


def rank_fn(rank: int, world: int, repeats: int) -> dict:
    """Median step seconds (slowest rank) of every variant at dp = world."""
    torch.manual_seed(1 + rank)  # a different batch per dp rank
    x = torch.randint(0, MODEL["vocab_size"], (1, MODEL["seq_len"]))
    y = torch.randint(0, MODEL["vocab_size"], (1, MODEL["seq_len"]))
    group = dist.group.WORLD
    runs = []
    for kind, mb, overlap in variants():
        torch.manual_seed(0)  # identical replicas, as after the broadcast of a real run
        model = Llama(bench_model(**MODEL))
        if kind == "ddp":
            runs.append((name(kind, mb, overlap), DistributedDataParallel(model, bucket_cap_mb=mb), None))
        else:
            runs.append(
                (
                    name(kind, mb, overlap),
                    model,
                    GradReducer(list(model.parameters()), group, bucket_mb=mb, overlap=overlap),
                )
            )
    times: dict[str, list[float]] = {n: [] for n, _, _ in runs}
    for r in range(1 + repeats):  # repeat 0 warms every variant up (DDP builds its buckets on step 1)
        shift = r % len(runs)  # rotate the order so no variant always follows the same neighbour
        for n, model, reducer in runs[shift:] + runs[:shift]:
            dist.barrier()
            t0 = time.perf_counter()
            model.zero_grad(set_to_none=True)
            cross_entropy(model(x), y).backward()
            if reducer is not None:
                reducer.finish()
            seconds = torch.tensor(time.perf_counter() - t0)
            dist.all_reduce(seconds, op=dist.ReduceOp.MAX)
            if r:
                times[n].append(float(seconds))
        if rank == 0:
            log(f"grad_buckets: dp={world} repeat {r}/{repeats} done")
    return {n: {"median": median(ts), "min": min(ts)} for n, ts in times.items()}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="2 timed repeats instead of 4")
    args = ap.parse_args()
    repeats = 2 if args.quick else 4
    results, goal = {}, {}
    for dp in (2, 4):
        log(f"grad_buckets: dp={dp}, {len(variants())} variants x {repeats} repeats")
        step = run_ranks(rank_fn, dp, repeats)[0]
        rows = []
        for kind, mb, overlap in variants():
            base, s = step[name(kind, 0.0, overlap)], step[name(kind, mb, overlap)]
            rows.append(
                {
                    "impl": "trainflow.GradReducer" if kind == "reducer" else "torch.DDP",
                    "bucket_mb": mb,
                    "overlap": overlap,
                    "step_s": round(s["median"], 4),
                    "step_min_s": round(s["min"], 4),
                    "per_param_over_this": round(base["median"] / s["median"], 3),
                    "per_param_over_this_min": round(base["min"] / s["min"], 3),
                }
            )
        results[f"dp{dp}"] = rows
        if dp == 4:
            ours = [r for r in rows if r["impl"] == "trainflow.GradReducer" and r["bucket_mb"] > 0]
            at_default = [r["per_param_over_this"] for r in ours if r["bucket_mb"] == 25.0]
            best = max(ours, key=lambda r: r["per_param_over_this"])
            goal = {
                "target": "per-parameter / bucketed >= 1.5 at dp=4",
                "at_25mb": {"after_backward": at_default[0], "overlap": at_default[1]},
                "best": {k: best[k] for k in ("bucket_mb", "overlap", "per_param_over_this")},
                "met_at_25mb": min(at_default) >= 1.5,
                "met_best": best["per_param_over_this"] >= 1.5,
            }
    model = Llama(bench_model(**MODEL))
    n_params, n_tensors = model.num_params(), len(list(model.parameters()))
    emit(
        {
            "benchmark": "grad_buckets",
            "model": {
                **MODEL,
                "params": n_params,
                "tensors": n_tensors,
                "grad_mb": round(n_params * 4 / 2**20, 1),
                "tokens_per_rank": MODEL["seq_len"],
            },
            "repeats": repeats,
            "step": results,
            "goal": {**goal, "met": goal["met_at_25mb"]},
        }
    )


if __name__ == "__main__":
    main()
