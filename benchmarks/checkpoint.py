"""Checkpoint throughput: CheckpointManager save/load vs a raw sequential write/read of the same bytes,
and CRC verification vs a plain read of the same files.

    python benchmarks/checkpoint.py [--quick] [--dir /tmp]

Goals: save and load throughput >= 0.7x the raw write / read (load >= 0.8x, issue 23); `manifest.verify`
(CRC-32C of every file) >= 0.9x a plain read of the same files; checkpoint.mode=async on the `shard` state:
training blocked <= 0.15x the sync save, and steps that overlap a background write <= 1.25x the others.

Two states, ~300 MB each (--quick: ~25 MB, the same tensors narrower), are what Trainer.state() saves for a
single-device run after one AdamW step (model, both moments, a step scalar per parameter), as flattened DCP state
dicts:
- `shard`: 2 layers of d=1024 (86 tensors of up to 12 MB). A Llama-70B rank under tp8 x pp8 holds
  tensors of 32-117 MB, so this is the smaller side of a real shard; the goals are judged here.
- `small_tensors`: 8 layers of d=512 (302 tensors, a quarter of them scalars). DCP writes every
  tensor as its own torch.save record, so this exposes the fixed cost per tensor, reported as
  `per_tensor_overhead_ms` (the extra save time over raw, less the shard's, per extra tensor).

Save is CheckpointManager.save on a 1-rank gloo group (DCP write in 2 threads with fsync, CRC-32C
while writing, manifest, rename); the raw write puts the same tensor bytes into a new file with
unbuffered writes and one fsync (the goal's baseline), and `raw_write_2_streams` splits them over
two files written by two threads, as DCP's writer does (the stricter baseline on a disk that
rewards concurrent writers, as this VM's does). All sides live alike: each writes its new copy while the previous
one still exists, then deletes the previous one untimed (the raw side unlinks it; the manager
prunes it in the background and the benchmark waits for that, reported as `prune_background`), and
each starts after an os.sync(), so neither pays for a deletion's journal commit (this disk is
mounted with -o discard: freed blocks are trimmed then). Load is CheckpointManager.load
(checkpoint.reader.InPlaceReader, into the existing tensors); the raw read reads the bytes back
into the same tensors. Before each load and read the files are dropped from the page cache with
posix_fadvise(DONTNEED) after an fsync (`cache_resident_after_drop` says how much stayed, from
util-linux fincore where present). A VM's host may still cache the disk below us, so "cold" means
cold for this kernel only. Verification is timed cold (the goal; 4 alternating pairs per round)
and warm. Throughputs count the state's tensor bytes for both sides.

This VM's disk and memory are noisy (a 300 MB write with fsync takes 0.25-1.1 s from one round to
the next, and a process's first few such writes are the slowest), so: rounds visit both states
(alternating which goes first), the writers and readers rotate order within a round, the first
WARMUP_ROUNDS rounds are not recorded, and each ratio is the median of the per-round ratios (only
operations timed next to each other compare); seconds are medians too. Each state keeps at most
two copies of each kind (~1.8 GB); the temporary folder is removed at the end.

Async (`async`, on the `shard` state): a training loop of its model (one thread, 1 x 32 tokens a step, ~0.2 s
here) saves every round, alternately in sync mode and in async mode beside the steps that follow, polling at
each step boundary as the trainer does until the save is durable. `blocking_over_sync_save` is the async save's
blocking time (staging, the optimizer step's wait for the background copy, the boundaries' agreements) over the
sync save's in the same round, median of rounds; `overlap_step_over_other_steps` the mean of the steps that ran
while a background write was in flight over the mean of the steps between (the sync saves' rounds and the steps
after each durable save), pooled over the recorded rounds.
"""

from __future__ import annotations

import argparse
import os
import shutil
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import torch
import torch.distributed as dist
from _common import bench_model, drop_cache, emit, log, median, single_rank_group

from trainflow.checkpoint.folders import step_dir
from trainflow.checkpoint.manager import CheckpointManager
from trainflow.checkpoint.manifest import verify
from trainflow.checkpoint.state import build_state as trainflow_state
from trainflow.config import OptimConfig
from trainflow.crc import BLOCK
from trainflow.model import Llama, cross_entropy
from trainflow.train.controls import build_optimizer

LLAMA = dict(vocab_size=256, n_heads=8, multiple_of=256, seq_len=128)
MODELS = {
    "shard": dict(LLAMA, n_layers=2, dim=1024),
    "small_tensors": dict(LLAMA, n_layers=8, dim=512),
}
VERIFY_PAIRS = 4  # cold verify / plain-read pairs per round
WARMUP_ROUNDS = 2  # this VM's first few 300 MB writes in a process run at a fraction of the later speed
QUICK_DIMS = {"shard": 256, "small_tensors": 128}
"""--quick's widths: the same layers and tensors as MODELS, ~25 MB a state instead of ~300 MB."""


def build_training(model_args: dict) -> tuple[Llama, torch.optim.Optimizer]:
    """A single-device model and its AdamW after one optimizer step (so AdamW's moments exist)."""
    torch.manual_seed(0)
    model = Llama(bench_model(**model_args))
    optim = OptimConfig(name="bench", lr=1e-4, warmup_steps=0, weight_decay=0.1, grad_clip=1.0)
    opt = build_optimizer(model, optim, torch.device("cpu"))
    for p in model.parameters():
        p.grad = torch.randn_like(p) * 1e-3
    opt.step()
    opt.zero_grad(set_to_none=True)
    return model, opt


def build_state(model_args: dict) -> dict:
    """Trainer.state() of a single-device run after one optimizer step."""
    model, opt = build_training(model_args)
    return trainflow_state([model], [opt])


def tensors(state: dict) -> list[torch.Tensor]:
    out = []
    for v in state.values():
        out.extend(tensors(v) if isinstance(v, dict) else [v] if isinstance(v, torch.Tensor) else [])
    return out


def leaves(state: dict) -> int:
    """Entries DCP writes as separate items: tensors and, pickled one by one, everything else."""
    return sum(leaves(v) if isinstance(v, dict) else 1 for v in state.values())


def as_bytes(t: torch.Tensor) -> memoryview:
    return memoryview(t.detach().contiguous().view(-1).view(torch.uint8).numpy())


def write_file(path: Path, ts: list[torch.Tensor]) -> None:
    with open(path, "wb", buffering=0) as f:
        for t in ts:
            f.write(as_bytes(t))
        os.fsync(f.fileno())


def raw_write(path: Path, ts: list[torch.Tensor]) -> float:
    t0 = time.perf_counter()
    write_file(path, ts)
    return time.perf_counter() - t0


def raw_write_streams(paths: list[Path], ts: list[torch.Tensor]) -> float:
    """The same bytes split by size over len(paths) files, written by as many threads (as DCP's writer does)."""
    buckets: list[list[torch.Tensor]] = [[] for _ in paths]
    for t in sorted(ts, key=lambda t: t.nbytes, reverse=True):
        min(buckets, key=lambda b: sum(x.nbytes for x in b)).append(t)
    t0 = time.perf_counter()
    with ThreadPoolExecutor(len(paths)) as pool:
        list(pool.map(write_file, paths, buckets))
    return time.perf_counter() - t0


def raw_read(path: Path, ts: list[torch.Tensor]) -> float:
    t0 = time.perf_counter()
    with open(path, "rb", buffering=0) as f:
        for t in ts:
            f.readinto(as_bytes(t))
    return time.perf_counter() - t0


def plain_read(files: list[Path]) -> float:
    """What file_crc does, less the CRC: the same 8 MiB readinto loop."""
    t0 = time.perf_counter()
    buf = bytearray(BLOCK)
    for path in files:
        with open(path, "rb", buffering=0) as f:
            while f.readinto(buf):
                pass
    return time.perf_counter() - t0


class StateBench:
    """Every timed operation on one state, a round at a time; rounds below `warmup` are not recorded."""

    def __init__(self, state: dict, work: Path, warmup: int) -> None:
        self.state, self.ts, self.work, self.warmup = state, tensors(state), work, warmup
        work.mkdir()
        self.manager = CheckpointManager(work / "checkpoints", keep=1, pinned=set())
        self.times = {
            k: []
            for k in (
                "raw_write",
                "raw_write_2_streams",
                "save",
                "prune_background",
                "raw_read",
                "load",
                "plain_read_cold",
                "verify_cold",
                "plain_read_warm",
                "verify_warm",
            )
        }
        self.resident: list[float] = []
        self.file_bytes = 0

    def round(self, r: int) -> None:
        def record(key: str, seconds: float) -> None:
            if r >= self.warmup:
                self.times[key].append(seconds)

        step, manager = r + 1, self.manager
        raw = self.work / f"raw-{step}.bin"
        writers = ("raw", "raw_2_streams", "trainflow")
        for which in writers[r % 3 :] + writers[: r % 3]:
            os.sync()  # earlier deletes are committed (with -o discard, trimmed) before the clock starts
            if which == "raw":
                record("raw_write", raw_write(raw, self.ts))
                (self.work / f"raw-{step - 1}.bin").unlink(missing_ok=True)
            elif which == "raw_2_streams":
                streams = [self.work / f"streams-{step}-{i}.bin" for i in range(2)]
                record("raw_write_2_streams", raw_write_streams(streams, self.ts))
                for i in range(2):
                    (self.work / f"streams-{step - 1}-{i}.bin").unlink(missing_ok=True)
            else:
                record("save", manager.save(step, self.state)[0].blocking_s)
                t0 = time.perf_counter()
                manager.wait()
                record("prune_background", time.perf_counter() - t0)
        files = sorted(p for p in step_dir(manager.root, step).rglob("*") if p.is_file())
        for which in ("raw", "trainflow") if r % 2 == 0 else ("trainflow", "raw"):
            if which == "raw":
                self.resident.append(drop_cache([raw]))
                record("raw_read", raw_read(raw, self.ts))
            else:
                self.resident.append(drop_cache(files))
                t0 = time.perf_counter()
                manager.load(step, self.state)
                record("load", time.perf_counter() - t0)
        data = [p for p in files if p.name != "manifest.json"]
        self.file_bytes = sum(p.stat().st_size for p in data)

        def read_once(which: str, cache: str) -> None:
            """One plain read or one CRC verification of the checkpoint's files, timed."""
            t0 = time.perf_counter()
            plain_read(data) if which == "plain" else verify(step_dir(manager.root, step))
            record(f"{'plain_read' if which == 'plain' else 'verify'}_{cache}", time.perf_counter() - t0)

        for k in range(VERIFY_PAIRS):  # cheap, and cold reads are the noisiest figure here
            for which in ("plain", "verify") if k % 2 == 0 else ("verify", "plain"):
                drop_cache(files)
                read_once(which, "cold")
        for which in ("plain", "verify"):  # warm: the cold pass above left every file cached
            read_once(which, "warm")

    def close(self) -> None:
        self.manager.close()
        shutil.rmtree(self.work, ignore_errors=True)

    def report(self, model_args: dict) -> dict:
        nbytes = sum(t.numel() * t.element_size() for t in self.ts)
        med = {k: median(v) for k, v in self.times.items()}
        pairs = {
            "save_over_raw_write": ("raw_write", "save"),
            "save_over_raw_write_2_streams": ("raw_write_2_streams", "save"),
            "load_over_raw_read": ("raw_read", "load"),
            "verify_over_plain_read_cold": ("plain_read_cold", "verify_cold"),
            "verify_over_plain_read_warm": ("plain_read_warm", "verify_warm"),
        }
        per_round = {
            name: [a / b for a, b in zip(self.times[base], self.times[ours], strict=True)]
            for name, (base, ours) in pairs.items()
        }
        return {
            "model": model_args,
            "tensors": len(self.ts),
            "scalar_tensors": sum(t.numel() == 1 for t in self.ts),
            "non_tensor_items": leaves(self.state) - len(self.ts),
            "tensor_bytes": nbytes,
            "checkpoint_file_bytes": self.file_bytes,
            "seconds": {k: round(v, 4) for k, v in med.items()},
            "gb_per_s": {k: round(nbytes / v / 1e9, 3) for k, v in med.items() if k != "prune_background"},
            "cache_resident_after_drop": [round(x, 4) for x in self.resident],
            "ratios": {name: round(median(r), 3) for name, r in per_round.items()},
            "ratio_min_max": {name: [round(min(r), 3), round(max(r), 3)] for name, r in per_round.items()},
        }


class AsyncBench:
    """checkpoint.mode=async beside training steps, against sync saves of the same state (module docstring)."""

    TOKENS = 32
    OUTSIDE_STEPS = 3  # steps after each durable async save and after each sync save, outside any write

    def __init__(self, model_args: dict, work: Path, warmup: int) -> None:
        self.model, self.opt = build_training(model_args)
        self.work, self.warmup = work, warmup
        work.mkdir()
        self.sync = CheckpointManager(work / "sync", keep=1, pinned=set())
        self.async_ = CheckpointManager(work / "async", keep=1, pinned=set(), mode="async")
        self.tokens = torch.randint(0, model_args["vocab_size"], (1, self.TOKENS), generator=torch.Generator())
        self.times = {"sync_save": [], "async_blocking": [], "async_background": []}
        self.steps = {"overlap": [], "other": []}
        self.step_no = 0

    def step(self) -> float:
        t0 = time.perf_counter()
        cross_entropy(self.model(self.tokens), self.tokens).backward()
        self.opt.step()
        self.opt.zero_grad(set_to_none=True)
        self.step_no += 1
        return time.perf_counter() - t0

    def round(self, r: int) -> None:
        recorded = r >= self.warmup
        for kind in ("sync", "async") if r % 2 == 0 else ("async", "sync"):
            state = trainflow_state([self.model], [self.opt], step=self.step_no)
            if kind == "sync":
                done = self.sync.save(self.step_no, state)
                self.sync.wait()
            else:
                assert self.async_.save(self.step_no, state, optimizers=[self.opt]) == []
                overlap, done = [], []
                while not done:
                    overlap.append(self.step())
                    done = self.async_.poll()
                self.async_.wait()
                if recorded:
                    self.steps["overlap"] += overlap
                    self.times["async_blocking"].append(done[0].blocking_s)
                    self.times["async_background"].append(done[0].background_s)
            if recorded and kind == "sync":
                self.times["sync_save"].append(done[0].blocking_s)
            other = [self.step() for _ in range(self.OUTSIDE_STEPS)]
            if recorded:
                self.steps["other"] += other

    def close(self) -> None:
        self.sync.close()
        self.async_.close()
        shutil.rmtree(self.work, ignore_errors=True)

    def report(self) -> dict:
        ratios = [a / s for a, s in zip(self.times["async_blocking"], self.times["sync_save"], strict=True)]
        mean = {k: sum(v) / len(v) for k, v in self.steps.items()}
        return {
            "tokens_per_step": self.TOKENS,
            "seconds": {k: round(median(v), 4) for k, v in self.times.items()},
            "mean_step_s": {k: round(v, 4) for k, v in mean.items()},
            "steps": {k: len(v) for k, v in self.steps.items()},
            "ratios": {
                "blocking_over_sync_save": round(median(ratios), 3),
                "overlap_step_over_other_steps": round(mean["overlap"] / mean["other"], 3),
            },
            "ratio_min_max": {"blocking_over_sync_save": [round(min(ratios), 3), round(max(ratios), 3)]},
        }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument(
        "--quick",
        action="store_true",
        help="states of ~25 MB instead of ~300 MB (the same tensors, narrower), no warm-up round and 1 recorded "
        "instead of 2 and 7",
    )
    ap.add_argument("--dir", default=None, help="where the temporary folder goes (default: the system's)")
    args = ap.parse_args()
    models = {name: m | {"dim": QUICK_DIMS[name]} for name, m in MODELS.items()} if args.quick else MODELS
    warmup, rounds = (0, 1) if args.quick else (WARMUP_ROUNDS, 7)
    torch.set_num_threads(1)
    single_rank_group()
    work = Path(tempfile.mkdtemp(prefix="trainflow-bench-checkpoint-", dir=args.dir))
    benches = {name: StateBench(build_state(m), work / name, warmup) for name, m in models.items()}
    asynchronous = AsyncBench(models["shard"], work / "async", warmup)
    try:
        for r in range(warmup + rounds):
            log(f"checkpoint: round {r + 1}/{warmup + rounds}{' (warm-up)' if r < warmup else ''}")
            for bench in benches.values() if r % 2 == 0 else reversed(benches.values()):
                bench.round(r)
            asynchronous.round(r)
        states = {name: bench.report(models[name]) for name, bench in benches.items()}
        async_report = asynchronous.report()
    finally:
        for bench in benches.values():
            bench.close()
        asynchronous.close()
        shutil.rmtree(work, ignore_errors=True)
        dist.destroy_process_group()
    shard, small = states["shard"], states["small_tensors"]
    extra = {name: st["seconds"]["save"] - st["seconds"]["raw_write"] for name, st in states.items()}
    per_tensor_s = (extra["small_tensors"] - extra["shard"]) / (small["tensors"] - shard["tensors"])
    ratios = shard["ratios"]
    overlap = async_report["ratios"]
    goal = {
        "save_ge_0.7": ratios["save_over_raw_write"] >= 0.7,
        "load_ge_0.8_both_states": all(st["ratios"]["load_over_raw_read"] >= 0.8 for st in states.values()),
        "verify_ge_0.9": ratios["verify_over_plain_read_cold"] >= 0.9,
        "async_blocking_le_0.15": overlap["blocking_over_sync_save"] <= 0.15,
        "async_overlap_steps_le_1.25": overlap["overlap_step_over_other_steps"] <= 1.25,
    }
    emit(
        {
            "benchmark": "checkpoint",
            "rounds": rounds,
            "warmup_rounds": warmup,
            "states": states,
            "async": async_report,
            "per_tensor_overhead_ms": round(1e3 * per_tensor_s, 3),
            "goal": {**goal, "judged_on": "shard (load: both states)", "met": all(goal.values())},
        }
    )


if __name__ == "__main__":
    main()
