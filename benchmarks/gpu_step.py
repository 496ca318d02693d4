"""One GPU's training step on 4 layers of Llama 3 8B at seq 8192: tokens/s, MFU and peak memory.

    python benchmarks/gpu_step.py [--batch 1] [--warmup 3] [--steps 10] [--no-compile] [--no-recompute]
                                  [--peak-tflops 989] [--fp8 delayed]

Anchor: torchtitan reports ~33-42 % MFU for Llama-3-8B on H100 (its docs/performance.md: 33-39 % for
Llama 3.1 8B under FSDP on 8 H100 at 500 W, seq 8192, local batch 2, selective activation
checkpointing, with / without torch.compile). A single GPU running 4 of the 32 layers is not that
run, but its MFU should land near it; far below says trainflow's step leaves the GPU idle.

The config is composed like a training run's: train_segment with model=llama3_8b cut to
model.n_layers=4 (the 128k-token embedding and output head kept, so they weigh more than in the full
model), seq 8192, cluster=alps_gh200 on one GPU, train.precision=bf16, train.activations=recompute and
train.compile=true (the last two switched off by --no-recompute / --no-compile). The step is
Trainer.train_step's on one process, less data loading: forward under torch.autocast(bf16) with fp32
weights, cross_entropy, backward, clip_grad_norm_, `build_optimizer`'s fused AdamW, zero_grad. Blocks are
set up as the Trainer does: `apply_activations` (recompute) first, then `apply_compile` inside it.
Batches are random tokens drawn on the GPU. The first --warmup steps (compilation, allocator growth) are
not timed; their total is `warmup_s`. Each timed step ends in a synchronising `loss.item()`, and the
median step gives tokens/s. MFU = tokens/s x flops_per_token / peak, with trainflow.config.shape's
flops_per_token (6 per matmul weight plus attention; recompute's extra forward is not counted, as in
torchtitan) and the peak of the cluster preset (989 TFLOP/s: H100/H200 dense bf16) unless --peak-tflops
says otherwise. Peak memory is torch.cuda.max_memory_allocated over the timed steps.

--fp8 dynamic|delayed (train.fp8) swaps the blocks' linears for Float8Linear first, as the Trainer does (before
recompute and compile), and rolls the delayed recipe's amax histories after each backward; the JSON names the
fp8_gemm implementation that ran and why (trainflow.fp8.kernels.backend_reason). Goal (issue 25): the fp8 step
>= 1.2x the bf16 step's tokens/s on one H200, not yet measured.
"""

from __future__ import annotations

import argparse
import sys
import time

import torch
from _common import emit, log, median

from trainflow.config import ConfigError, compose
from trainflow.config.schema import FP8_RECIPES, PRECISIONS
from trainflow.config.shape import flops_per_token
from trainflow.fp8 import apply_fp8, sync_amax_history
from trainflow.fp8.kernels import backend_reason
from trainflow.model import Llama, cross_entropy
from trainflow.train.activations import apply_activations
from trainflow.train.compile import apply_compile
from trainflow.train.controls import build_optimizer


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--batch", type=int, default=1, help="sequences per step (default 1)")
    ap.add_argument("--warmup", type=int, default=3, help="untimed steps first (default 3)")
    ap.add_argument("--steps", type=int, default=10, help="timed steps (default 10)")
    ap.add_argument("--no-compile", action="store_true", help="eager blocks (train.compile=false)")
    ap.add_argument("--no-recompute", action="store_true", help="keep every activation (train.activations=keep)")
    ap.add_argument("--peak-tflops", type=float, default=0.0, help="dense bf16 peak per GPU (default: alps_gh200's)")
    ap.add_argument("--fp8", choices=("none", *FP8_RECIPES), default="none", help="train.fp8 (default none)")
    args = ap.parse_args()
    if not torch.cuda.is_available():
        sys.exit("gpu_step: no CUDA device here (torch.cuda.is_available() is False); run it on a GPU node")
    if args.warmup < 1 or args.steps < 1 or args.peak_tflops < 0:
        sys.exit(
            f"gpu_step: --warmup {args.warmup} --steps {args.steps} --peak-tflops {args.peak_tflops:g}: "
            "need >= 1 warm-up step (it compiles), >= 1 timed step and a peak >= 0 (0: the preset's)"
        )
    try:
        cfg = compose(
            "train_segment",
            [
                "model=llama3_8b",
                "model.n_layers=4",
                "model.seq_len=8192",
                "cluster=alps_gh200",
                "cluster.allocation.nodes=1",
                "cluster.allocation.gpus_per_node=1",
                "parallel=single",
                f"train.global_batch={args.batch}",
                "train.precision=bf16",
                f"train.activations={'keep' if args.no_recompute else 'recompute'}",
                f"train.compile={str(not args.no_compile).lower()}",
                f"train.fp8={args.fp8}",
            ],
        )
    except ConfigError as err:
        sys.exit(f"gpu_step: {err}")
    m, t = cfg.model, cfg.train
    peak_tflops = args.peak_tflops or cfg.cluster.hardware.peak_tflops
    device = torch.device("cuda")
    torch.manual_seed(t.seed)
    with device:
        model = Llama(m)  # initialised on the GPU: 1.9 B parameters would take long on the host
    fp8_gemm = apply_fp8(model, recipe=t.fp8, history_len=t.fp8_amax_history) if t.fp8 != "none" else None
    apply_activations([model], t.activations)
    if t.compile:
        apply_compile([model], device)
    opt = build_optimizer(model, cfg.optim, device)
    dtype = getattr(torch, PRECISIONS[t.precision].dtype)

    def step() -> float:
        """One training step; its loss (reading it waits for the GPU)."""
        x = torch.randint(0, m.vocab_size, (t.global_batch, m.seq_len), device=device)
        y = torch.randint(0, m.vocab_size, (t.global_batch, m.seq_len), device=device)
        with torch.autocast("cuda", dtype=dtype):
            loss = cross_entropy(model(x), y)
        loss.backward()  # outside autocast, as torch's AMP recipe says
        sync_amax_history([model], None)  # delayed fp8: this step's amaxes into the histories (else nothing)
        torch.nn.utils.clip_grad_norm_(model.parameters(), cfg.optim.grad_clip)
        opt.step()
        opt.zero_grad(set_to_none=True)
        return loss.item()

    name = f"{m.name} x {m.n_layers} layers, batch {t.global_batch} x {m.seq_len}"
    log(f"gpu_step: {name} on {torch.cuda.get_device_name()}, {args.warmup} warm-up steps")
    start = time.perf_counter()
    losses = [step() for _ in range(args.warmup)]
    warmup_s = time.perf_counter() - start
    torch.cuda.reset_peak_memory_stats()
    log(f"gpu_step: {args.steps} timed steps")
    seconds = []
    for _ in range(args.steps):
        t0 = time.perf_counter()
        losses.append(step())
        seconds.append(time.perf_counter() - t0)
    step_s = median(seconds)
    tokens_per_s = t.global_batch * m.seq_len / step_s
    fpt = flops_per_token(m)
    emit(
        {
            "benchmark": "gpu_step",
            "device": torch.cuda.get_device_name(),
            "model": {"preset": m.name, "n_layers": m.n_layers, "seq_len": m.seq_len, "params": model.num_params()},
            "batch": t.global_batch,
            "precision": t.precision,
            "activations": t.activations,
            "compile": t.compile,
            "fp8": t.fp8,
            "fp8_gemm": backend_reason(device) if fp8_gemm else None,
            "warmup_steps": args.warmup,
            "warmup_s": round(warmup_s, 2),
            "steps": args.steps,
            "step_s": round(step_s, 4),
            "step_min_max_s": [round(min(seconds), 4), round(max(seconds), 4)],
            "tokens_per_s": round(tokens_per_s, 1),
            "flops_per_token": fpt,
            "peak_tflops": peak_tflops,
            "mfu": round(tokens_per_s * fpt / (peak_tflops * 1e12), 4),
            "peak_memory_gib": round(torch.cuda.max_memory_allocated() / 2**30, 2),
            "peak_reserved_gib": round(torch.cuda.max_memory_reserved() / 2**30, 2),
            "loss_first_last": [round(losses[0], 4), round(losses[-1], 4)],
            "anchor": "torchtitan: ~33-42 % MFU for Llama-3-8B on H100",
        }
    )


if __name__ == "__main__":
    main()
