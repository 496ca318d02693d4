"""One GPU's training step on 4 layers of Llama 3 8B at seq 8192: tokens/s, MFU and peak memory, in bf16 and fp8,
eager and compiled, beside torchao's float8 training where it is installed, and where an fp8 linear's time goes.

    python benchmarks/gpu_step.py [--quick] [--compare] [--fp8 delayed] [--no-compile] [--batch 1] [--warmup 3]
                                  [--steps 10] [--no-recompute] [--peak-tflops 989]

Anchor: torchtitan reports ~33-42 % MFU for Llama-3-8B on H100 (its docs/performance.md: 33-39 % for
Llama 3.1 8B under FSDP on 8 H100 at 500 W, seq 8192, local batch 2, selective activation
checkpointing, with / without torch.compile). A single GPU running 4 of the 32 layers is not that
run, but its MFU should land near it; far below says trainflow's step leaves the GPU idle.

The config is composed like a training run's: train_segment with model=llama3_8b cut to model.n_layers=4 (the
128k-token embedding and output head kept, so they weigh more than in the full model), seq 8192, cluster=alps_gh200
on one GPU, train.precision=bf16, train.activations=recompute (--no-recompute: keep). The step is
Trainer.train_step's on one process, less data loading: forward under torch.autocast(bf16) with fp32 weights,
cross_entropy, backward, the delayed recipe's amax histories rolled, clip_grad_norm_, fused AdamW, zero_grad. Blocks
are set up as the Trainer does: fp8 linears first (apply_fp8), then `apply_activations`, then `apply_compile`.
Batches are random tokens drawn on the GPU. The first --warmup steps (compilation, allocator growth) are not timed
(`warmup_s`); each timed step ends in a synchronising `loss.item()`, and the median step gives tokens/s. MFU =
tokens/s x flops_per_token / peak (trainflow.config.shape; recompute's extra forward not counted, as in torchtitan).

One variant runs by default: --fp8 (train.fp8, default none) and compiled unless --no-compile. --compare runs, in
one process: bf16, fp8 (--fp8's recipe, delayed by default) and, where `torchao` imports, torchao's float8 training
(tensorwise dynamic scaling, its default recipe, on the same block linears: the reference), each eager and, unless
--no-compile, compiled; then `ratios` (each over bf16 of the same mode) and `linear_split`: for each distinct block
linear at the step's tokens, the seconds of one forward and backward of the Float8Linear (delayed, its history
full), of its three fp8 GEMMs alone, and of its casts alone (trainflow.fp8.fused: one pass per tensor), the rest
being `other` (autograd, reshapes, the output's dtype), beside the bf16 nn.Linear's. Goal (issue 46) on one H200:
fp8 >= 1.0x bf16 eager, >= 1.3x compiled; not yet measured with the one-pass casts (2026-12-04, before them: 0.83x
eager, 1.146x compiled). --quick: 1 warm-up and 2 timed steps, 1 layer, seq 2048; without a GPU it prints one line
and exits 0.
"""

from __future__ import annotations

import argparse
import gc
import importlib.util
import sys
import time

import torch
from _common import emit, log, median

from trainflow.config import ConfigError, compose
from trainflow.config.schema import FP8_RECIPES, PRECISIONS
from trainflow.config.shape import flops_per_token
from trainflow.fp8 import apply_fp8, sync_amax_history
from trainflow.fp8.apply import block_linears
from trainflow.fp8.cast import E4M3, E5M2, scale_from_amax
from trainflow.fp8.fused import cast_pair
from trainflow.fp8.kernels import backend_reason
from trainflow.fp8.linear import Float8Linear
from trainflow.fp8.ops import fp8_gemm
from trainflow.model import Llama, cross_entropy
from trainflow.train.activations import apply_activations
from trainflow.train.compile import apply_compile
from trainflow.train.controls import build_optimizer

TORCHAO = "torchao"  # the --compare variant's fp8 name
VARIANT = {"none": "bf16", TORCHAO: TORCHAO}  # a variant's name by its fp8; trainflow's recipes: fp8
SPLIT_REPEATS = 10


def config(args, *, fp8: str, compile: bool):
    layers, seq = (1, 2048) if args.quick else (4, 8192)
    overrides = ["model=llama3_8b", f"model.n_layers={layers}", f"model.seq_len={seq}", "cluster=alps_gh200"]
    overrides += ["cluster.allocation.nodes=1", "cluster.allocation.gpus_per_node=1", "parallel=single"]
    overrides += [f"train.global_batch={args.batch}", "train.precision=bf16", f"train.compile={str(compile).lower()}"]
    overrides += [f"train.activations={'keep' if args.no_recompute else 'recompute'}"]
    return compose("train_segment", [*overrides, f"train.fp8={'none' if fp8 == TORCHAO else fp8}"])


def apply_torchao(model: torch.nn.Module) -> str:
    """torchao's float8 training on the block linears apply_fp8 would swap (the embedding and head stay)."""
    from torchao.float8 import convert_to_float8_training

    swapped = {id(linear) for block in model.layers.values() for _, _, linear in block_linears(block)}
    convert_to_float8_training(model, module_filter_fn=lambda module, fqn: id(module) in swapped)
    return "torchao.float8: tensorwise dynamic scaling (its default recipe), torch._scaled_mm"


def run_variant(args, *, fp8: str, compile: bool, peak_tflops: float) -> dict:
    """One variant's warm-up and timed steps (its model and optimizer are garbage once it returns)."""
    cfg = config(args, fp8=fp8, compile=compile)
    m, t = cfg.model, cfg.train
    device = torch.device("cuda")
    torch.manual_seed(t.seed)
    with device:
        model = Llama(m)  # initialised on the GPU: 1.9 B parameters would take long on the host
    gemm = None
    if fp8 == TORCHAO:
        gemm = apply_torchao(model)
    elif fp8 != "none":
        apply_fp8(model, recipe=fp8, history_len=t.fp8_amax_history)
        gemm = backend_reason(device)
    apply_activations([model], t.activations)
    if compile:
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

    log(f"gpu_step: {m.name} x {m.n_layers} layers, {t.global_batch} x {m.seq_len}, fp8 {fp8}, compile {compile}")
    start = time.perf_counter()
    losses = [step() for _ in range(args.warmup)]
    warmup_s = time.perf_counter() - start
    torch.cuda.reset_peak_memory_stats()
    seconds = []
    for _ in range(args.steps):
        t0 = time.perf_counter()
        losses.append(step())
        seconds.append(time.perf_counter() - t0)
    step_s = median(seconds)
    tokens_per_s = t.global_batch * m.seq_len / step_s
    result = {
        "model": {"preset": m.name, "n_layers": m.n_layers, "seq_len": m.seq_len, "params": model.num_params()},
        "batch": t.global_batch,
        "precision": t.precision,
        "activations": t.activations,
        "compile": compile,
        "fp8": fp8,
        "fp8_gemm": gemm,
        "warmup_steps": args.warmup,
        "warmup_s": round(warmup_s, 2),
        "steps": args.steps,
        "step_s": round(step_s, 4),
        "step_min_max_s": [round(min(seconds), 4), round(max(seconds), 4)],
        "tokens_per_s": round(tokens_per_s, 1),
        "flops_per_token": flops_per_token(m),
        "peak_tflops": peak_tflops,
        "mfu": round(tokens_per_s * flops_per_token(m) / (peak_tflops * 1e12), 4),
        "peak_memory_gib": round(torch.cuda.max_memory_allocated() / 2**30, 2),
        "peak_reserved_gib": round(torch.cuda.max_memory_reserved() / 2**30, 2),
        "loss_first_last": [round(losses[0], 4), round(losses[-1], 4)],
    }
    return result


def timed(fn, repeats: int = SPLIT_REPEATS) -> float:
    """Median seconds of fn() between CUDA events, after one untimed call."""
    fn()
    seconds = []
    for _ in range(repeats):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        end.synchronize()
        seconds.append(start.elapsed_time(end) / 1e3)
    return median(seconds)


def split_one(name: str, linear: torch.nn.Linear, tokens: int) -> dict:
    """One block linear at `tokens` rows: Float8Linear (delayed, history full: one pass per cast) forward and
    backward, its three GEMMs alone, its casts alone, and the bf16 nn.Linear's forward and backward."""
    k, n = linear.in_features, linear.out_features
    x = torch.randn(tokens, k, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    g = torch.randn(tokens, n, device="cuda", dtype=torch.bfloat16)
    fp8 = Float8Linear.from_linear(linear, recipe="delayed", history_len=16)
    fp8(x).backward(g)
    sync_amax_history([fp8], None)  # the history holds a step: the one-pass path from here

    def layer(module):
        return lambda: module(x).backward(g)

    total = timed(layer(fp8))
    one = torch.ones((), device="cuda")
    xq, xqt = cast_pair(x.detach(), one, E4M3)
    wq, wqt = cast_pair(linear.weight.detach(), one, E4M3)
    gq, gqt = cast_pair(g, one, E5M2)
    gemms = [(xq, wq, torch.bfloat16), (gq, wqt, torch.bfloat16), (gqt, xqt, torch.float32)]  # y, dX, dW
    matmul = timed(lambda: [fp8_gemm(a, b, one, one, dtype) for a, b, dtype in gemms])
    tensors = [(x.detach(), E4M3), (linear.weight.detach(), E4M3), (g, E5M2)]
    scaled = [(t, scale_from_amax(t.abs().amax(), dtype), dtype) for t, dtype in tensors]
    casts = timed(lambda: [cast_pair(t, scale, dtype) for t, scale, dtype in scaled])
    bf16 = linear.to(torch.bfloat16)
    return {
        "linear": name,
        "tokens_in_out": [tokens, k, n],
        "fp8_s": round(total, 6),
        "fp8_matmul_s": round(matmul, 6),
        "fp8_casts_s": round(casts, 6),
        "fp8_other_s": round(total - matmul - casts, 6),
        "bf16_s": round(timed(layer(bf16)), 6),
    }


def linear_split(args) -> list[dict]:
    """split_one for each distinct (in, out) block linear of the model, at the step's tokens."""
    cfg = config(args, fp8="none", compile=False)
    with torch.device("cuda"):
        block = Llama(cfg.model).layers["0"]
    seen, rows = set(), []
    for _, attr, linear in block_linears(block):
        if (linear.in_features, linear.out_features) not in seen:
            seen.add((linear.in_features, linear.out_features))
            rows.append(split_one(attr, linear, cfg.train.global_batch * cfg.model.seq_len))
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="1 layer at seq 2048, 1 warm-up and 2 timed steps")
    ap.add_argument("--compare", action="store_true", help="bf16, fp8 and torchao, eager and compiled, and the split")
    ap.add_argument("--batch", type=int, default=1, help="sequences per step (default 1)")
    ap.add_argument("--warmup", type=int, default=3, help="untimed steps first (default 3)")
    ap.add_argument("--steps", type=int, default=10, help="timed steps (default 10)")
    ap.add_argument("--no-compile", action="store_true", help="eager blocks only (train.compile=false)")
    ap.add_argument("--no-recompute", action="store_true", help="keep every activation (train.activations=keep)")
    ap.add_argument("--peak-tflops", type=float, default=0.0, help="dense bf16 peak per GPU (default: alps_gh200's)")
    ap.add_argument("--fp8", choices=("none", *FP8_RECIPES), help="train.fp8 (default none; --compare: delayed)")
    args = ap.parse_args()
    if not torch.cuda.is_available():
        print("gpu_step: no CUDA device here (torch.cuda.is_available() is False); nothing measured")
        sys.exit(0)
    if args.quick:
        args.warmup, args.steps = 1, 2
    if args.warmup < 1 or args.steps < 1 or args.peak_tflops < 0:
        sys.exit(
            f"gpu_step: --warmup {args.warmup} --steps {args.steps} --peak-tflops {args.peak_tflops:g}: "
            "need >= 1 warm-up step (it compiles), >= 1 timed step and a peak >= 0 (0: the preset's)"
        )
    recipe = args.fp8 or ("delayed" if args.compare else "none")
    try:
        peak = args.peak_tflops or config(args, fp8="none", compile=False).cluster.hardware.peak_tflops
    except ConfigError as err:
        sys.exit(f"gpu_step: {err}")
    modes = [False] if args.no_compile else ([False, True] if args.compare else [True])
    torchao = [TORCHAO] if importlib.util.find_spec(TORCHAO) else []
    kinds = ["none", recipe, *torchao] if args.compare else [recipe]
    variants = {f"{VARIANT.get(f, 'fp8')}_{'compiled' if c else 'eager'}": (f, c) for f in kinds for c in modes}
    results = {}
    for name, (f, c) in variants.items():
        results[name] = run_variant(args, fp8=f, compile=c, peak_tflops=peak)
        gc.collect()  # the last variant's model and optimizer, before the next is built
        torch.cuda.empty_cache()
    out = {"benchmark": "gpu_step", "device": torch.cuda.get_device_name(), "variants": results}
    if args.compare:
        out["ratios"] = {
            f"{name.rsplit('_', 1)[0]}_over_bf16_{name.rsplit('_', 1)[1]}": round(
                r["tokens_per_s"] / results[f"bf16_{name.rsplit('_', 1)[1]}"]["tokens_per_s"], 3
            )
            for name, r in results.items()
            if not name.startswith("bf16")
        }
        out["goal"] = {"fp8_over_bf16_eager": 1.0, "fp8_over_bf16_compiled": 1.3}
        out["torchao"] = "installed" if torchao else "not installed: pip install torchao==0.18.0"
        out["linear_split"] = linear_split(args)
    out["anchor"] = "torchtitan: ~33-42 % MFU for Llama-3-8B on H100"
    emit(out)


if __name__ == "__main__":
    main()
