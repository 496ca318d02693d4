"""torch.compile on CPU: the tiny Llama's training step compiled (`apply_compile`) vs eager.

    python benchmarks/compile.py [--quick] [--batch 4] [--seq-len 512]

No goal on CPU: inductor's CPU kernels are not what trainflow compiles for (train.compile targets GPUs),
so `compiled_over_eager` is reported, not judged. Two checks come with it: the compile time, and the
largest loss difference between the two models over the timed steps.

The model is the tiny preset (conf/model/tiny.yaml: 4 layers, d=128, 4 query / 2 key-value heads,
byte vocabulary 257) at seq 512, the optimizer `build_optimizer`'s AdamW (foreach on CPU) with the
adamw preset, on train.threads_per_rank threads (1, as in training). The compiled model is a copy of
the eager one with `apply_compile([model], cpu)`, so both start from the same weights; both train on
the same batches.
A step is what Trainer.train_step does on one process, less data loading: forward, cross_entropy,
backward, clip_grad_norm_, AdamW step, zero_grad.

Each model first runs WARMUP untimed steps: the compiled model's first step traces every block (one
graph, shared by the identical blocks) and builds inductor's C++ kernels for forward and backward.
`compile_s` is the compiled warm-up's time less WARMUP steady compiled steps; it is cold: inductor's
cache is a fresh temporary folder (a rerun with a warm cache, as a resumed segment gets, compiles far
faster). Then each repeat times a block of STEPS steps of each model, in alternating order (AB, BA,
...), and the ratio of the pair is taken, so load drift on this shared machine cancels; medians of
the repeats are reported, with the ratio of the two fastest blocks beside them (other work only ever
adds time). The loss difference is not zero: inductor fuses and reorders float32 arithmetic, and the
two models' weights drift apart by rounding as they train; `loss_difference_first_step` (same
weights) is the numerics alone.

--quick builds inductor's scalar C++ (cpp.vec_isa_ok off): most of a cold compile here goes to the vector ISA (its
probes, and the vector headers in every kernel's build), twice to three times the scalar build's time, so its
compile_s is not the benchmark's.
"""

from __future__ import annotations

import argparse
import copy
import sys
import time

import torch
from _common import emit, log, median
from torch._inductor import config as inductor_config
from torch._inductor.utils import fresh_cache

from trainflow.config import ConfigError, compose
from trainflow.config.shape import flops_per_token
from trainflow.model import Llama, cross_entropy
from trainflow.train.compile import apply_compile
from trainflow.train.controls import build_optimizer

WARMUP = 2  # untimed steps per model; the compiled model compiles in its first
STEPS = 2  # steps per timed block
CPU = torch.device("cpu")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument(
        "--quick",
        action="store_true",
        help="batch 2 x seq 128, 1 repeat instead of 7, inductor's scalar C++ (no vector ISA)",
    )
    ap.add_argument("--batch", type=int, default=4, help="sequences per step (default 4)")
    ap.add_argument("--seq-len", type=int, default=512, help="tokens per sequence (default 512)")
    args = ap.parse_args()
    if args.quick:
        args.batch, args.seq_len = 2, 128
        inductor_config.cpp.vec_isa_ok = False  # the docstring's last paragraph
    if args.batch < 1 or args.seq_len < 2:
        sys.exit(
            f"compile: --batch {args.batch} --seq-len {args.seq_len}: need a batch >= 1 and a sequence of >= 2 tokens"
        )
    repeats = 1 if args.quick else 7
    cfg = compose("train_segment", ["model=tiny", f"model.seq_len={args.seq_len}"])
    m, optim = cfg.model, cfg.optim
    torch.set_num_threads(cfg.train.threads_per_rank)
    torch.manual_seed(0)
    eager = Llama(m)
    compiled = copy.deepcopy(eager)
    try:
        apply_compile([compiled], CPU)
    except ConfigError as err:
        sys.exit(f"compile: {err}")
    models = {"eager": eager, "compiled": compiled}
    opts = {k: build_optimizer(model, optim, CPU) for k, model in models.items()}
    n_steps = WARMUP + repeats * STEPS
    batches = [
        (
            torch.randint(0, m.vocab_size, (args.batch, m.seq_len)),
            torch.randint(0, m.vocab_size, (args.batch, m.seq_len)),
        )
        for _ in range(n_steps)
    ]
    losses: dict[str, list[float]] = {k: [] for k in models}

    def run(which: str, steps: range) -> float:
        """Train `which` on batches[steps]; the seconds it took."""
        model, opt = models[which], opts[which]
        start = time.perf_counter()
        for i in steps:
            x, y = batches[i]
            loss = cross_entropy(model(x), y)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), optim.grad_clip)
            opt.step()
            opt.zero_grad(set_to_none=True)
            losses[which].append(loss.item())
        return time.perf_counter() - start

    with fresh_cache():
        log(f"compile: {WARMUP} warm-up steps per model (the compiled one compiles first)")
        warmup_s = {k: run(k, range(WARMUP)) for k in models}
        log(f"compile: {repeats} repeats of {STEPS} steps per model")
        times: dict[str, list[float]] = {k: [] for k in models}
        for r in range(repeats):
            steps = range(WARMUP + r * STEPS, WARMUP + (r + 1) * STEPS)
            for k in ("eager", "compiled") if r % 2 == 0 else ("compiled", "eager"):
                times[k].append(run(k, steps) / STEPS)
    ratios = [c / e for c, e in zip(times["compiled"], times["eager"], strict=True)]
    step_s = {k: median(ts) for k, ts in times.items()}
    diffs = [abs(a - b) for a, b in zip(losses["eager"], losses["compiled"], strict=True)]
    tokens = args.batch * m.seq_len
    emit(
        {
            "benchmark": "compile",
            "model": {
                "preset": m.name,
                "seq_len": m.seq_len,
                "params": eager.num_params(),
                "batch": args.batch,
                "flops_per_token": flops_per_token(m),
            },
            "threads": cfg.train.threads_per_rank,
            "warmup_steps": WARMUP,
            "steps_per_repeat": STEPS,
            "repeats": repeats,
            "compile_s": round(warmup_s["compiled"] - WARMUP * step_s["compiled"], 2),
            "warmup_s": {k: round(v, 3) for k, v in warmup_s.items()},
            "eager_step_s": round(step_s["eager"], 4),
            "compiled_step_s": round(step_s["compiled"], 4),
            "tokens_per_s": {k: round(tokens / v, 1) for k, v in step_s.items()},
            "compiled_over_eager": round(median(ratios), 4),
            "ratio_min_max": [round(min(ratios), 4), round(max(ratios), 4)],
            "ratio_of_fastest_blocks": round(min(times["compiled"]) / min(times["eager"]), 4),
            "max_loss_difference": max(diffs[WARMUP:]),
            "loss_difference_first_step": diffs[0],
            "loss_first_last": {k: [round(v[0], 4), round(v[-1], 4)] for k, v in losses.items()},
        }
    )


if __name__ == "__main__":
    main()
