"""Activation memory: the peak memory and time of one training step under each activation mode, measured
against keep and against trainflow.plan.memory's estimate.

    python benchmarks/activation_memory.py [--quick] [--batch 8] [--precision fp32]

Goal: recompute <= 0.4 x keep's peak memory at <= 1.4 x keep's step time.

One process, one thread (the trainer's per-rank default), no torch.distributed: the tiny Llama (4
layers, d=128, vocab 257) at seq 512, batch 8, where the blocks' activations (~45 kB per token under
keep) outweigh the weights and AdamW state (~10 MB) twentyfold. A step is the runtime's: forward and
loss (under autocast for bf16), backward, AdamW step of `build_optimizer` (foreach), zero_grad. The
modes, each on its own copy of the same model, set by `apply_activations`: keep, recompute, offload to
host memory (on a CPU that is the same memory: torch's save_on_cpu keeps a CPU tensor as it is, so
nothing should fall), and offload to a folder in a temporary directory.

Memory: the weights and AdamW state held before the step (counted from the tensors) plus the most the
step allocates on top, from torch's profiler (trainflow.plan.peak); `activations_mb` is the peak less
that held state. Time: each repeat times one step of every mode, in an order rotated per repeat, and
the ratios to keep are taken within a repeat; medians. The goal takes CPU time (process_time): the
step runs one thread and, but for offload_folder, waits on nothing, so its CPU time is its work, while
its wall time on this shared 2-core machine (load 4-9 while this was written) also measures how often
the scheduler ran it. Wall-clock ratios are reported beside it (median, and of each mode's fastest step:
other work only ever adds time); offload_folder's read and write waits show only there. Profiled steps
are not timed (the profiler slows them).
"""

from __future__ import annotations

import argparse
import copy
import tempfile
import time
from pathlib import Path

import torch
from _common import emit, log, median

from trainflow.config import ParallelDims, compose
from trainflow.model import Llama, cross_entropy
from trainflow.plan.memory import device_memory
from trainflow.plan.peak import peak_bytes
from trainflow.plan.setup import model_counts
from trainflow.train.activations import apply_activations
from trainflow.train.controls import build_optimizer

MODES = {  # name -> (train.activations, offload to a folder)
    "keep": ("keep", False),
    "recompute": ("recompute", False),
    "offload_host": ("offload", False),
    "offload_folder": ("offload", True),
}
SEQ = 512
GOAL = {"memory": 0.4, "time": 1.4}
MB = 1e6


class Run:
    """One mode's model, optimizer and step."""

    def __init__(self, base: Llama, mode: str, folder: Path, *, optim, precision: str, x, y) -> None:
        self.model = copy.deepcopy(base)
        activations, to_folder = MODES[mode]
        self.offloader = apply_activations([self.model], activations, folder / mode if to_folder else None)
        self.opt = build_optimizer(self.model, optim, torch.device("cpu"))
        self.bf16, self.x, self.y = precision == "bf16", x, y
        self.step()  # AdamW makes its state at the first step; the allocator warms up

    def step(self) -> None:
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=self.bf16):
            loss = cross_entropy(self.model(self.x), self.y)
        loss.backward()
        self.opt.step()
        self.opt.zero_grad(set_to_none=True)

    def held_bytes(self) -> int:
        state = sum(t.nbytes for s in self.opt.state.values() for t in s.values())
        return sum(p.nbytes for p in self.model.parameters()) + state

    def timed_step(self) -> tuple[float, float]:
        """Wall and CPU seconds of one step."""
        wall, cpu = time.perf_counter(), time.process_time()
        self.step()
        return time.perf_counter() - wall, time.process_time() - cpu


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument(
        "--quick", action="store_true", help="batch 2, 1 timed and 1 profiled step per mode instead of 7 and 3"
    )
    ap.add_argument("--batch", type=int, default=8, help="sequences of 512 tokens per step")
    ap.add_argument("--precision", choices=("fp32", "bf16"), default="fp32", help="bf16: autocast, slow on most CPUs")
    args = ap.parse_args()
    torch.set_num_threads(1)
    if args.quick:
        args.batch = 2
    repeats, profiled = (1, 1) if args.quick else (7, 3)
    cfg = compose("train_segment", ["model=tiny", f"model.seq_len={SEQ}"])
    m = cfg.model
    torch.manual_seed(0)
    base = Llama(m)
    x, y = torch.randint(0, m.vocab_size, (2, args.batch, SEQ))
    with tempfile.TemporaryDirectory(prefix="activation_memory-") as tmp:
        runs = {mode: Run(base, mode, Path(tmp), optim=cfg.optim, precision=args.precision, x=x, y=y) for mode in MODES}
        log(f"activation_memory: {len(MODES)} modes, batch {args.batch} x seq {SEQ}, {repeats} repeats")
        times: dict[str, list[tuple[float, float]]] = {mode: [] for mode in MODES}
        names = list(MODES)
        for r in range(repeats):
            for mode in names[r % len(names) :] + names[: r % len(names)]:
                times[mode].append(runs[mode].timed_step())
        peaks = {
            mode: median([run.held_bytes() + peak_bytes(run.step) for _ in range(profiled)])
            for mode, run in runs.items()
        }
        held = {mode: run.held_bytes() for mode, run in runs.items()}
        for run in runs.values():
            if run.offloader is not None:
                run.offloader.close()

    dims = ParallelDims(dp=1, tp=1, pp=1, world_size=1)
    modes = {}
    for mode, (activations, to_folder) in MODES.items():
        e = device_memory(
            m,
            dims,
            counts=model_counts(m, dims),
            microbatch_size=args.batch,
            precision=args.precision,
            activations=activations,
            offload_to_disk=to_folder,
            device="cpu",
        )
        modes[mode] = {
            "peak_mb": round(peaks[mode] / MB, 2),
            "activations_mb": round((peaks[mode] - held[mode]) / MB, 2),
            "estimate_mb": round(e.total / MB, 2),
            "estimate_activations_mb": round(e.activations / MB, 2),
            "estimate_over_measured": round(e.total / peaks[mode], 3),
            "step_s": round(median([wall for wall, _ in times[mode]]), 4),
            "step_cpu_s": round(median([cpu for _, cpu in times[mode]]), 4),
        }

    def time_ratios(mode: str, kind: int) -> list[float]:
        return [t[kind] / k[kind] for t, k in zip(times[mode], times["keep"])]

    ratios = {
        f"{mode}/keep": {
            "memory": round(peaks[mode] / peaks["keep"], 3),
            "activation_memory": round((peaks[mode] - held[mode]) / (peaks["keep"] - held["keep"]), 3),
            "cpu_time": round(median(time_ratios(mode, 1)), 3),
            "wall_time": round(median(time_ratios(mode, 0)), 3),
            "wall_time_of_fastest_steps": round(min(t for t, _ in times[mode]) / min(t for t, _ in times["keep"]), 3),
        }
        for mode in MODES
        if mode != "keep"
    }
    recompute = ratios["recompute/keep"]
    emit(
        {
            "benchmark": "activation_memory",
            "model": {"name": m.name, "params": base.num_params(), "batch": args.batch, "seq": SEQ},
            "precision": args.precision,
            "threads": 1,
            "repeats": repeats,
            "modes": modes,
            "ratios": ratios,
            "goal": {
                "target": f"recompute/keep memory <= {GOAL['memory']} at time <= {GOAL['time']}",
                "memory": recompute["memory"],
                "time": recompute["cpu_time"],
                "met": recompute["memory"] <= GOAL["memory"] and recompute["cpu_time"] <= GOAL["time"],
            },
        }
    )


if __name__ == "__main__":
    main()
