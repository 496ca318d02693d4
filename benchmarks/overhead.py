"""Framework overhead: trainflow's single-process training step vs a minimal plain-PyTorch loop.

    python benchmarks/overhead.py [--quick]

Goal: trainflow step / plain step <= 1.05 (median over interleaved repeats).

trainflow's step is Trainer.train_step's, less data loading: set the lr on every param group,
`Parallelized.forward_backward` (built by `parallelize_model` at world size 1: a 1-rank gloo group and
ParallelDims(1, 1, 1)), `Parallelized.clip_grad_norm`, the AdamW step of `build_optimizer` (foreach on
CPU, as the Trainer builds it), zero_grad. The plain loop is what a user writes: model(x),
F.cross_entropy, backward, clip_grad_norm_, `torch.optim.AdamW(model.parameters(), lr=..., betas=...,
weight_decay=...)` with torch's default implementation (on CPU the per-tensor loop), zero_grad. Same
hyperparameters, same starting weights, same batches; one thread (what the Trainer sets per rank).
Each repeat times a block of 4 steps of each, in alternating order (AB, BA, ...), and the ratio of the
pair is taken, so load drift on this shared machine cancels; the ratio of the two fastest blocks is
reported beside the median (other work only ever adds time). The model is the tiny preset's Llama
(4 layers, d=128, 4 query / 2 key-value heads, SwiGLU 384, T=128; vocab 256: 0.85 M parameters),
batch 8, where a fixed per-step cost shows most; `--large` adds a 12-layer d=256 row.
"""

from __future__ import annotations

import argparse
import copy
import time

import torch
import torch.distributed as dist
import torch.nn.functional as F
from _common import bench_model, emit, log, median, single_rank_group

from trainflow.config import OptimConfig
from trainflow.config.layout import ParallelDims
from trainflow.model import Llama, cross_entropy
from trainflow.parallel import parallelize_model
from trainflow.parallel.mesh import build_mesh
from trainflow.train.controls import build_optimizer

LLAMA = dict(vocab_size=256, n_heads=4, n_kv_heads=2, seq_len=128)
SMALL = dict(LLAMA, n_layers=4, dim=128)
LARGE = dict(LLAMA, n_layers=12, dim=256)
OPTIM = OptimConfig(name="bench", lr=3e-4, warmup_steps=0, weight_decay=0.1, grad_clip=1.0)
STEPS = 4  # steps per timed block


def adamw_impl(opt: torch.optim.Optimizer) -> str:
    """Which AdamW implementation a step runs: fused, foreach, or the per-tensor loop."""
    d = opt.defaults
    if d["fused"] or d["foreach"]:
        return "fused" if d["fused"] else "foreach"
    return "per-tensor loop" if d["foreach"] is False else "torch's default (on CPU the per-tensor loop)"


def compare(cfg: dict, *, batch: int, steps: int, repeats: int) -> dict:
    torch.manual_seed(0)
    model_cfg = bench_model(**cfg)
    base = Llama(model_cfg)
    dims = ParallelDims(dp=1, tp=1, pp=1, world_size=1)
    par = parallelize_model(
        copy.deepcopy(base),
        dims,
        build_mesh(dims, "cpu"),
        loss_fn=cross_entropy,
        device=torch.device("cpu"),
        bucket_mb=25.0,
        overlap=True,
    )
    tf_opts = [build_optimizer(part, OPTIM, torch.device("cpu")) for part in par.parts]
    plain = copy.deepcopy(base)
    # What a user writes: torch picks the implementation (foreach/fused left at None).
    plain_opt = torch.optim.AdamW(
        plain.parameters(), lr=OPTIM.lr, betas=(OPTIM.beta1, OPTIM.beta2), weight_decay=OPTIM.weight_decay
    )
    batches = [
        (
            torch.randint(0, cfg["vocab_size"], (batch, cfg["seq_len"])),
            torch.randint(0, cfg["vocab_size"], (batch, cfg["seq_len"])),
        )
        for _ in range(steps)
    ]

    phases = {k: dict.fromkeys(("forward_backward", "clip", "optimizer"), 0.0) for k in ("trainflow", "plain")}

    def trainflow_steps() -> float:
        t, start = phases["trainflow"], time.perf_counter()
        for x, y in batches:
            t0 = time.perf_counter()
            for opt in tf_opts:
                for group in opt.param_groups:
                    group["lr"] = OPTIM.lr
            par.forward_backward(x, y)
            t1 = time.perf_counter()
            par.clip_grad_norm(OPTIM.grad_clip)
            t2 = time.perf_counter()
            for opt in tf_opts:
                opt.step()
                opt.zero_grad(set_to_none=True)
            t3 = time.perf_counter()
            t["forward_backward"] += t1 - t0
            t["clip"] += t2 - t1
            t["optimizer"] += t3 - t2
        return time.perf_counter() - start

    def plain_steps() -> float:
        t, start = phases["plain"], time.perf_counter()
        for x, y in batches:
            t0 = time.perf_counter()
            logits = plain(x)
            loss = F.cross_entropy(logits.flatten(0, 1), y.flatten(0, 1))
            loss.backward()
            t1 = time.perf_counter()
            torch.nn.utils.clip_grad_norm_(plain.parameters(), OPTIM.grad_clip)
            t2 = time.perf_counter()
            plain_opt.step()
            plain_opt.zero_grad(set_to_none=True)
            t3 = time.perf_counter()
            t["forward_backward"] += t1 - t0
            t["clip"] += t2 - t1
            t["optimizer"] += t3 - t2
        return time.perf_counter() - start

    trainflow_steps(), plain_steps()  # warm-up: allocator, AdamW state
    for t in phases.values():
        t.update(dict.fromkeys(t, 0.0))
    ratios, tf_s, plain_s = [], [], []
    for r in range(repeats):
        if r % 2 == 0:
            a, b = trainflow_steps(), plain_steps()
        else:
            b, a = plain_steps(), trainflow_steps()
        ratios.append(a / b)
        tf_s.append(a / steps)
        plain_s.append(b / steps)
    # Not bit-identical: trainflow sums squares in float64 and scales only above max_norm, and foreach AdamW
    # rounds differently from the per-tensor loop.
    with torch.no_grad():
        drift = max(float((p - q).abs().max()) for p, q in zip(par.parts[0].parameters(), plain.parameters()))
    n = repeats * steps
    return {
        "model": {**cfg, "ffn_dim": model_cfg.ffn_dim, "params": base.num_params(), "batch": batch},
        "adamw": {"trainflow": adamw_impl(tf_opts[0]), "plain": adamw_impl(plain_opt)},
        "trainflow_step_s": round(median(tf_s), 5),
        "plain_step_s": round(median(plain_s), 5),
        "ratio_median": round(median(ratios), 4),
        "ratio_min_max": [round(min(ratios), 4), round(max(ratios), 4)],
        "ratio_of_fastest_blocks": round(min(tf_s) / min(plain_s), 4),
        "phase_ms_per_step": {k: {p: round(v / n * 1e3, 2) for p, v in t.items()} for k, t in phases.items()},
        "max_weight_difference_after": drift,
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="11 repeats instead of 25")
    ap.add_argument("--large", action="store_true", help="also a 12-layer d=256 Llama")
    args = ap.parse_args()
    torch.set_num_threads(1)
    single_rank_group()
    repeats = 11 if args.quick else 25
    rows = []
    for cfg in (SMALL, LARGE) if args.large else (SMALL,):
        log(f"overhead: {cfg['n_layers']} layers d={cfg['dim']}, {repeats} repeats")
        rows.append(compare(cfg, batch=8, steps=STEPS, repeats=repeats))
    dist.destroy_process_group()
    worst = max(r["ratio_median"] for r in rows)
    emit(
        {
            "benchmark": "overhead",
            "threads": 1,
            "steps_per_repeat": STEPS,
            "repeats": repeats,
            "rows": rows,
            "goal": {"target": "trainflow / plain <= 1.05", "ratio": worst, "met": worst <= 1.05},
        }
    )


if __name__ == "__main__":
    main()
