"""The planner against the trainer: calibrate trainflow.plan's constants here, then predict and measure the
step split of short runs on dp2, pp2 (1F1B), tp2 and dp2 x tp2 x pp2.

    python benchmarks/plan_vs_measured.py [--steps 6]

Goal: predicted / measured step time within 0.67-1.5x on every layout.

Calibration, on this machine, one thread per rank as the trainer runs:
- matmul probe: the forward matmuls of one microbatch through one block and the output head, at the
  layout's own shapes (tokens per microbatch, tp-split widths), timed; achieved FLOP/s becomes
  cluster.peak_tflops with matmul_efficiency 1.
- block probe, beside it: one trainflow Block's forward and backward on one microbatch (full width), its
  model FLOPs over its time. The plan counts matmul FLOPs only; the block also runs norms, rotary
  embeddings, softmax and SwiGLU's elementwise ops, which a bare-GEMM rate leaves out (on this VM the
  block reached ~0.75x the bare matmuls' FLOP/s). Both predictions are printed.
  When the layout has more ranks than this machine has cores, each rank gets cores / ranks of both
  FLOP/s (the ranks time-share the cores; stated, not fitted).
- gloo all_reduce probe: 2 ranks, 16 KiB and 4 MiB fp32, median of 20; the two points of t = 2 alpha +
  S / B (a ring of two) give cluster.intra_node_gbps and intra_node_latency_us (one node: every group is
  inside it).
- AdamW probe: gradient clipping and one step of trainflow's optimizer on the model's tensors give
  cluster.memory_gbps through trainflow.plan.step.OPTIMIZER_BYTES, with the same core share.
Everything else (overlap_fraction) is conf/cluster/local.yaml's.

Measured: train_segment.run (the real launcher: submitit's local executor, one process per rank, gloo)
on a 4-layer Llama of d=256 and 256-token sequences (big enough that matmuls, not Python, make the
step), rank 0's step records; the median over the steps after the first. Predicted: the plan of the
same config, pipeline rank 0 (rank 0 writes the step log). trainflow.plan.versus pairs each measured part
with the plan's parts it holds (the report does the same); the goal's ratio is the plan's step over the
measured step less data loading, which the plan does not model.
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path

import torch
import torch.distributed as dist
from _common import emit, log, median, run_ranks

from trainflow.config import compose
from trainflow.model import Block, Llama, rope_tables
from trainflow.plan.build import build_plan
from trainflow.plan.memory import layer_params
from trainflow.plan.step import OPTIMIZER_BYTES
from trainflow.plan.versus import measured_split, side_by_side
from trainflow.stage import read_json
from trainflow.stages import prepare_data, train_segment
from trainflow.train.controls import build_optimizer

LAYOUTS = {"dp2": "dp2", "pp2_1f1b": "pp2_1f1b", "tp2": "tp2", "dp2_tp2_pp2": "dp2_tp2_pp2"}
MODEL = [
    "model.dim=256",
    "model.n_heads=4",
    "model.n_kv_heads=2",
    "model.seq_len=256",
    "model.multiple_of=64",
    "train.global_batch=8",
]
RUN = ["train.segments=1", "train.eval_batches=1", "train.log_every=1", "checkpoint.interval_steps=1000"]
SIZES = (2**12, 2**20)  # fp32 elements of the two all_reduce probe messages: 16 KiB, 4 MiB


def timed(fn, repeats: int) -> float:
    """Median seconds of fn() over `repeats` calls, after one warm-up call."""
    fn()
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def matmul_flops_per_s(cfg) -> float:
    """FLOP/s of one microbatch's forward matmuls through one block and the head at the layout's shapes."""
    m, p = cfg.model, cfg.parallel
    tokens = cfg.train.global_batch // (p.dp * p.microbatches) * m.seq_len
    q, kv, f = m.n_heads * m.head_dim // p.tp, m.n_kv_heads * m.head_dim // p.tp, m.ffn_dim // p.tp
    x, wide = torch.randn(tokens, m.dim), torch.randn(tokens, max(q, f))
    shapes = [
        (m.dim, q),
        (m.dim, kv),
        (m.dim, kv),
        (q, m.dim),
        (m.dim, f),
        (m.dim, f),
        (f, m.dim),
        (m.dim, m.vocab_size),
    ]
    weights = [torch.randn(k, n) for k, n in shapes]

    def run() -> None:
        for (k, _), w in zip(shapes, weights):
            (x if k == m.dim else wide[:, :k]) @ w

    flops = sum(2 * tokens * k * n for k, n in shapes)
    return flops / timed(run, 10)


def block_flops_per_s(cfg) -> float:
    """FLOP/s of one block's forward and backward (trainflow.model.Block, full width) on one microbatch."""
    m, p = cfg.model, cfg.parallel
    rows = cfg.train.global_batch // (p.dp * p.microbatches)
    block, (cos, sin) = Block(m), rope_tables(m.head_dim, m.seq_len, m.rope_theta)
    x = torch.randn(rows, m.seq_len, m.dim, requires_grad=True)
    flops = rows * m.seq_len * (6 * (layer_params(m) - 2 * m.dim) + 12 * m.dim * m.seq_len)
    return flops / timed(lambda: block(x, cos, sin).sum().backward(), 10)


def adamw_bytes_per_s(cfg) -> float:
    """Bytes per second of clipping and trainflow's AdamW on the whole model's tensors, per OPTIMIZER_BYTES."""
    model = Llama(cfg.model)
    params = list(model.parameters())
    for p in params:
        p.grad = torch.randn_like(p)
    opt = build_optimizer(model, cfg.optim, torch.device("cpu"))

    def run() -> None:
        torch.nn.utils.clip_grad_norm_(params, 1e9)
        opt.step()

    return sum(p.numel() for p in params) * OPTIMIZER_BYTES / timed(run, 10)


def allreduce_rank(rank: int, world: int) -> list[float]:
    """Median seconds of an all_reduce of each SIZES message on this 2-rank gloo group."""
    out = []
    for n in SIZES:
        buf = torch.ones(n)
        times = []
        for _ in range(21):
            dist.barrier()
            start = time.perf_counter()
            dist.all_reduce(buf)
            times.append(time.perf_counter() - start)
        out.append(median(times[1:]))
    return out


def calibrate_link() -> dict:
    """Bandwidth and latency of gloo on this machine from the two all_reduce probes (t = 2 alpha + S / B)."""
    t_small, t_large = run_ranks(allreduce_rank, 2)[0]
    (s_small, s_large) = (4 * n for n in SIZES)
    gbps = (s_large - s_small) / (t_large - t_small) / 1e9
    latency_s = max(0.0, (t_small - s_small / (gbps * 1e9)) / 2)
    return {"gbps": gbps, "latency_us": latency_s * 1e6, "probe_s": [t_small, t_large]}


def ratio(result: dict, probe: str) -> float:
    """Predicted / measured step (less data loading) of one layout's result, by one probe's constants."""
    return result[f"by_{probe}_probe"]["compare"]["step_s_less_data"]["ratio"]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=6, help="training steps per layout (the first is warm-up)")
    args = ap.parse_args()
    torch.set_num_threads(1)
    cores = torch.multiprocessing.cpu_count()
    link = calibrate_link()
    log(f"plan_vs_measured: gloo {link['gbps']:.3f} GB/s, {link['latency_us']:.0f} us per hop")
    root = Path(tempfile.mkdtemp(prefix="plan_vs_measured_"))
    tokens = root / "tokens" / "index.json"
    prepare_data.run(compose("prepare_data", ["experiment=smoke", f"io.tokens={tokens}"]))
    results = {}
    for name, preset in LAYOUTS.items():
        base = ["experiment=smoke", f"parallel={preset}", *MODEL, *RUN, f"train.segment_steps={args.steps}"]
        cfg = compose("train_segment", base)
        share = min(1.0, cores / cfg.parallel.world_size)
        probes = {"matmul": matmul_flops_per_s(cfg) * share, "block": block_flops_per_s(cfg) * share}
        common = {
            "cluster.matmul_efficiency": 1.0,
            "cluster.memory_gbps": adamw_bytes_per_s(cfg) * share / 1e9,
            "cluster.intra_node_gbps": link["gbps"],
            "cluster.intra_node_latency_us": link["latency_us"],
        }
        preds = {}
        for probe, flops in probes.items():
            constants = {"cluster.peak_tflops": flops / 1e12, **common}
            planned = compose("train_segment", base + [f"{k}={v}" for k, v in constants.items()])
            preds[probe] = build_plan(planned, with_remedies=False)["step"]["per_pp_rank"][0]
        pred = preds["matmul"]
        log(f"plan_vs_measured: {name}: predicted {sum(pred.values()):.3f} s per step (matmul probe); training")
        run_cfg = compose("train_segment", base + [f"storage.root={root / name}", f"io.staged_tokens={tokens}"])
        train_segment.run(run_cfg)
        summary = read_json(run_cfg.io.segment_report)
        meas = measured_split(summary["steps"])
        results[name] = {
            "core_share": share,
            "flops_per_s": probes,
            "constants": common,
            "measured": meas,
            **{
                f"by_{probe}_probe": {
                    "predicted": preds[probe],
                    "compare": side_by_side(preds[probe], meas, layout=summary["layout"]),
                }
                for probe in probes
            },
        }
        log(
            f"plan_vs_measured: {name}: measured {meas['step_s']:.3f} s, predicted/measured "
            + ", ".join(f"{q} {ratio(results[name], q):.2f}" for q in probes)
        )
    ratios = {probe: {k: ratio(r, probe) for k, r in results.items()} for probe in ("matmul", "block")}
    emit(
        {
            "benchmark": "plan_vs_measured",
            "model": MODEL,
            "steps": args.steps,
            "gloo": link,
            "layouts": results,
            "step_ratio": ratios,
            "goal": {probe: all(0.67 <= r <= 1.5 for r in rs.values()) for probe, rs in ratios.items()},
        }
    )


if __name__ == "__main__":
    main()
