"""Checkpoint throughput: CheckpointManager save/load vs a raw sequential write/read of the same bytes,
and CRC verification vs a plain read of the same files.

    python benchmarks/checkpoint.py [--quick] [--dir /tmp]

Goals: save and load throughput >= 0.7x the raw write / read; `manifest.verify` (CRC-32C of every
file) >= 0.9x a plain read of the same files.

The state is what Trainer.state() saves for a single-device run: a trainflow GPT of 8 layers, d=512
(25 M parameters) and its AdamW moments, as flattened DCP state dicts, ~300 MB. Save is
CheckpointManager.save on a 1-rank gloo group (DCP write with fsync, CRC + fsync pass, manifest,
rename, prune); the raw write puts the same tensor bytes into one file with unbuffered writes and
one fsync. Load is CheckpointManager.load (DCP into the existing tensors); the raw read reads the
bytes back into the same tensors. Before each load and read the files are dropped from the page
cache with posix_fadvise(DONTNEED) after an fsync (clean pages are evicted; `cache_resident_after_drop`
says how much stayed, from util-linux fincore where present). A VM's host may still cache the disk
below us, so "cold" means cold for this kernel only. Verification is timed cold (the goal; 4 alternating pairs per repeat) and warm.
Throughputs count the state's tensor bytes for both sides. Raw and trainflow alternate order each
repeat; medians are reported. At most one checkpoint, its .tmp twin and the raw file exist at once
(~1 GB); the temporary folder is removed at the end.
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import torch
import torch.distributed as dist
from _common import emit, log, median, single_rank_group

from trainflow.checkpoint import manager as manager_module
from trainflow.checkpoint.manager import CheckpointManager, step_dir
from trainflow.checkpoint.manifest import BLOCK, verify
from trainflow.model import GPT
from trainflow.checkpoint.state import build_state as trainflow_state

MODEL = dict(vocab_size=256, n_layers=8, n_heads=8, dim=512, ffn_dim=2048, seq_len=128)
VERIFY_PAIRS = 4  # cold verify / plain-read pairs per repeat


def build_state() -> dict:
    """Trainer.state() of a single-device run after one optimizer step (so AdamW's moments exist)."""
    torch.manual_seed(0)
    model = GPT(**MODEL)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4, foreach=False)
    for p in model.parameters():
        p.grad = torch.randn_like(p) * 1e-3
    opt.step()
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


def raw_write(path: Path, ts: list[torch.Tensor]) -> float:
    t0 = time.perf_counter()
    with open(path, "wb", buffering=0) as f:
        for t in ts:
            f.write(as_bytes(t))
        os.fsync(f.fileno())
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


def drop_cache(files: list[Path]) -> float:
    """Evict the files from this kernel's page cache; the fraction that stayed resident (-1: unknown)."""
    for path in files:
        fd = os.open(path, os.O_RDONLY)
        try:
            os.fsync(fd)
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        finally:
            os.close(fd)
    if not shutil.which("fincore"):
        return -1.0
    out = subprocess.run(["fincore", "--bytes", "--noheadings", "--raw", "-o", "RES,SIZE", *map(str, files)],
                         capture_output=True, text=True, check=True).stdout.split()
    res, size = sum(map(int, out[0::2])), sum(map(int, out[1::2]))
    return res / max(size, 1)


def timed(fn: Callable, sink: list[float]) -> Callable:
    """fn, recording the seconds of its latest call in sink[0] (to split CheckpointManager.save)."""

    def wrapper(*args, **kwargs):
        t0 = time.perf_counter()
        try:
            return fn(*args, **kwargs)
        finally:
            sink[0] = time.perf_counter() - t0

    return wrapper


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="2 repeats instead of 3")
    ap.add_argument("--dir", default=None, help="where the temporary folder goes (default: the system's)")
    args = ap.parse_args()
    repeats = 2 if args.quick else 3
    torch.set_num_threads(1)
    single_rank_group()
    state = build_state()
    ts = tensors(state)
    nbytes = sum(t.numel() * t.element_size() for t in ts)
    work = Path(tempfile.mkdtemp(prefix="trainflow-bench-checkpoint-", dir=args.dir))
    split = {"manifest": [0.0], "prune": [0.0]}  # seconds of save's last write_manifest / prune
    write_manifest = manager_module.write_manifest
    manager_module.write_manifest = timed(write_manifest, split["manifest"])
    times = {k: [] for k in ("raw_write", "save", "save_manifest", "save_prune", "raw_read", "load",
                             "plain_read_cold", "verify_cold", "plain_read_warm", "verify_warm")}
    resident = []
    try:
        manager = CheckpointManager(work / "checkpoints", keep=1, pinned=set())
        manager.prune = timed(manager.prune, split["prune"])
        raw = work / "raw.bin"
        for r in range(repeats):
            log(f"checkpoint: repeat {r + 1}/{repeats} ({nbytes / 1e6:.0f} MB)")
            step = r + 1
            for which in (("raw", "trainflow") if r % 2 == 0 else ("trainflow", "raw")):
                if which == "raw":
                    times["raw_write"].append(raw_write(raw, ts))
                else:
                    times["save"].append(manager.save(step, state))
                    times["save_manifest"].append(split["manifest"][0])
                    times["save_prune"].append(split["prune"][0])
            files = sorted(p for p in step_dir(manager.root, step).rglob("*") if p.is_file())
            for which in (("raw", "trainflow") if r % 2 == 0 else ("trainflow", "raw")):
                if which == "raw":
                    resident.append(drop_cache([raw]))
                    times["raw_read"].append(raw_read(raw, ts))
                else:
                    resident.append(drop_cache(files))
                    t0 = time.perf_counter()
                    manager.load(step, state)
                    times["load"].append(time.perf_counter() - t0)
            data = [p for p in files if p.name != "manifest.json"]
            def read_once(which: str, cache: str) -> None:
                """One plain read or one CRC verification of the checkpoint's files, timed."""
                if which == "plain":
                    times[f"plain_read_{cache}"].append(plain_read(data))
                else:
                    t0 = time.perf_counter()
                    verify(step_dir(manager.root, step))
                    times[f"verify_{cache}"].append(time.perf_counter() - t0)

            for k in range(VERIFY_PAIRS):  # cheap, and cold reads are the noisiest figure here
                for which in (("plain", "verify") if k % 2 == 0 else ("verify", "plain")):
                    drop_cache(files)
                    read_once(which, "cold")
            for which in ("plain", "verify"):  # warm: the cold pass above left every file cached
                read_once(which, "warm")
        ckpt_bytes = sum(p.stat().st_size for p in data)
    finally:
        manager_module.write_manifest = write_manifest
        shutil.rmtree(work, ignore_errors=True)
        dist.destroy_process_group()
    med = {k: median(v) for k, v in times.items()}
    gbps = {k: round(nbytes / v / 1e9, 3) for k, v in med.items() if not k.startswith("save_")}
    save_ratio = med["raw_write"] / med["save"]
    load_ratio = med["raw_read"] / med["load"]
    verify_ratio = med["plain_read_cold"] / med["verify_cold"]
    emit({
        "benchmark": "checkpoint",
        "state": {"model": MODEL, "tensors": len(ts), "scalar_tensors": sum(t.numel() == 1 for t in ts),
                  "non_tensor_items": leaves(state) - len(ts), "tensor_bytes": nbytes,
                  "checkpoint_file_bytes": ckpt_bytes},
        "repeats": repeats,
        "seconds": {k: round(v, 4) for k, v in med.items()},
        "gb_per_s": gbps,
        "save_split_s": {"dcp_save_and_barriers": round(med["save"] - med["save_manifest"] - med["save_prune"], 4),
                         "write_manifest_crc_fsync": round(med["save_manifest"], 4),
                         "prune_previous": round(med["save_prune"], 4)},
        "cache_resident_after_drop": [round(x, 4) for x in resident],
        "ratios": {
            "save_over_raw_write": round(save_ratio, 3),
            "load_over_raw_read": round(load_ratio, 3),
            "verify_over_plain_read_cold": round(verify_ratio, 3),
            "verify_over_plain_read_warm": round(med["plain_read_warm"] / med["verify_warm"], 3),
        },
        "goal": {
            "save_ge_0.7": save_ratio >= 0.7,
            "load_ge_0.7": load_ratio >= 0.7,
            "verify_ge_0.9": verify_ratio >= 0.9,
            "met": save_ratio >= 0.7 and load_ratio >= 0.7 and verify_ratio >= 0.9,
        },
    })


if __name__ == "__main__":
    main()
