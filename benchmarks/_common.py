"""Helpers shared by the benchmarks: free port, median, gloo ranks in fresh processes, JSON output.

    python benchmarks/<name>.py [--quick]   # each benchmark prints one JSON object to stdout

Every benchmark measures the thing and its baseline side by side in one run and reports a ratio:
this machine is shared and noisy (2 cores, other work running), so absolute numbers from different
runs do not compare, ratios from one run do.
"""

from __future__ import annotations

import datetime
import json
import os
import queue
import shutil
import socket
import statistics
import subprocess
import sys
import time
import traceback
from collections.abc import Callable
from pathlib import Path

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from trainflow.config import ModelConfig


def bench_model(**shape: object) -> ModelConfig:
    """A Llama config named `bench` of `shape` (vocab_size, n_layers, n_heads, dim, seq_len, ...); what a
    benchmark leaves out takes plain values: a key/value head per query head, SwiGLU 8/3 dim rounded up to 64,
    rotary base 1e4."""
    plain = {"n_kv_heads": shape["n_heads"], "ffn_dim_multiplier": 1.0, "multiple_of": 64, "rope_theta": 1e4}
    return ModelConfig(name="bench", **(plain | shape))


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on right now."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def median(xs: list[float]) -> float:
    return statistics.median(xs)


def init_group(rank: int, world: int, port: int) -> None:
    dist.init_process_group(
        "gloo",
        init_method=f"tcp://127.0.0.1:{port}",
        rank=rank,
        world_size=world,
        timeout=datetime.timedelta(seconds=300),
    )


def single_rank_group() -> None:
    """A 1-rank gloo group in this process, for library code that calls dist.get_rank() / barrier()."""
    init_group(0, 1, free_port())


def run_here(fn: Callable, *args: object, threads: int = 1) -> list:
    """run_ranks(fn, 1, *args) in this process: fn(0, 1, *args) on a 1-rank gloo group, without the seconds a spawned
    process spends importing torch and tearing it down (a --quick path's saving; the thread count stays set)."""
    torch.set_num_threads(threads)
    single_rank_group()
    try:
        return [fn(0, 1, *args)]
    finally:
        dist.destroy_process_group()


def _rank_main(fn: Callable, rank: int, world: int, port: int, threads: int, results: mp.Queue, args: tuple) -> None:
    torch.set_num_threads(threads)
    try:
        init_group(rank, world, port)
        out = fn(rank, world, *args)
        dist.destroy_process_group()
        results.put((rank, out, None))
    except BaseException:  # noqa: BLE001 - the parent reports it with the rank
        results.put((rank, None, traceback.format_exc()))


def run_ranks(fn: Callable, world: int, *args: object, threads: int = 1, timeout_s: float = 600) -> list:
    """Run fn(rank, world, *args) in `world` spawned processes joined by a gloo group; the results by rank.

    fn must be a module-level function of the benchmark script (spawn pickles it by name). A rank that
    raises or dies makes this raise, naming the rank and its traceback.
    """
    ctx = mp.get_context("spawn")
    results = ctx.Queue()
    port = free_port()
    procs = [ctx.Process(target=_rank_main, args=(fn, r, world, port, threads, results, args)) for r in range(world)]
    for p in procs:
        p.start()
    out: dict[int, object] = {}
    deadline = time.monotonic() + timeout_s
    try:
        while len(out) < world:
            try:
                rank, value, error = results.get(timeout=1.0)
            except queue.Empty:
                dead = [r for r, p in enumerate(procs) if p.exitcode not in (None, 0) and r not in out]
                if dead:
                    raise RuntimeError(
                        f"rank {dead[0]} exited with code {procs[dead[0]].exitcode} before reporting"
                    ) from None
                if time.monotonic() > deadline:
                    raise TimeoutError(
                        f"{world - len(out)} of {world} ranks did not finish within {timeout_s:.0f} s"
                    ) from None
                continue
            if error is not None:
                raise RuntimeError(f"rank {rank} failed:\n{error}")
            out[rank] = value
        for p in procs:
            p.join(timeout=30)
    finally:
        for p in procs:  # only the processes started above, by their handle
            if p.is_alive():
                p.terminate()
                p.join(timeout=10)
    return [out[r] for r in range(world)]


def log(msg: str) -> None:
    """Progress goes to stderr; stdout carries only the JSON result."""
    print(msg, file=sys.stderr, flush=True)


def emit(result: dict) -> None:
    """Print the benchmark's one JSON object to stdout."""
    result.setdefault(
        "machine", {"cpus": os.cpu_count(), "torch": torch.__version__, "load_avg_1m": round(os.getloadavg()[0], 2)}
    )
    json.dump(result, sys.stdout, indent=1)
    sys.stdout.write("\n")
    sys.stdout.flush()


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
    out = subprocess.run(
        ["fincore", "--bytes", "--noheadings", "--raw", "-o", "RES,SIZE", *map(str, files)],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.split()
    res, size = sum(map(int, out[0::2])), sum(map(int, out[1::2]))
    return res / max(size, 1)
