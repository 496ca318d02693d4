"""A job start's checkpoint load at dp1, dp2 and dp4: the bytes read from the checkpoint's files and the time, the
single read (checkpoint.single_read, what CheckpointManager.load does) beside each replica reading its own copy (what
the load did before: rank 0 re-reads every file for its CRC, then DCP reads every rank's plan from the files).

    python benchmarks/checkpoint_load.py [--quick] [--dir /tmp]

Goals (issue 32): at dp4, bytes read per job start <= 1.1 x the checkpoint's size; dp4's load time <= 1.25 x dp1's.

Each dp runs as that many gloo ranks in fresh processes (CPU), all holding the same replicated state (`--mb` MB of
fp32 tensors of 4 MB, as a dp replica's model and AdamW moments), saved once by CheckpointManager at that world size
as a dpN run saves it. A round times one job start of each kind, in alternating order: every rank waits at a barrier,
rank 0 drops the checkpoint's files from this kernel's page cache (fsync + posix_fadvise(DONTNEED)), and the start is
newest_complete (rank 0 checks the manifest) then the load into fresh tensors; its time is the slowest rank's. The
single read's bytes are the reader's own counter (CheckpointManager.load's LoadDone, summed over ranks); the per-replica
baseline's are rank 0's CRC pass (every file) plus the bytes of the records each rank's DCP plan reads. Times are
medians of the rounds after the first; ratios are of medians of the same run (this VM is shared and noisy).
"""

from __future__ import annotations

import argparse
import shutil
import tempfile
import time
from pathlib import Path

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from _common import drop_cache, emit, log, median, run_ranks

from trainflow.checkpoint.manager import CheckpointManager, step_dir
from trainflow.checkpoint.manifest import read_manifest, verify
from trainflow.checkpoint.reader import ExactLoadPlanner, InPlaceReader

DPS = (1, 2, 4)
TENSOR_MB = 4


class CountingReader(InPlaceReader):
    """The load before the single read, counting the bytes of the records its plan reads."""

    bytes_read = 0

    def read_file(self, path, items, planner) -> None:  # noqa: ANN001 (InPlaceReading's)
        self.bytes_read += sum(self.storage_data[item.storage_index].length for item in items)
        super().read_file(path, items, planner)


def state(mb: int) -> dict:
    g = torch.Generator().manual_seed(0)
    n = TENSOR_MB * (1 << 20) // 4
    return {"model": {f"w{i}": torch.randn(n, generator=g) for i in range(mb // TENSOR_MB)}, "step": torch.tensor(1)}


def blank(like: dict) -> dict:
    return {k: blank(v) if isinstance(v, dict) else torch.empty_like(v) for k, v in like.items()}


def slowest(seconds: float) -> float:
    t = torch.tensor(seconds, dtype=torch.float64)
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    return float(t)


def summed(n: int) -> int:
    t = torch.tensor(n, dtype=torch.int64)
    dist.all_reduce(t)
    return int(t)


def single_read(manager: CheckpointManager, s: dict) -> tuple[float, int]:
    start = time.perf_counter()
    step = manager.newest_complete(at_most=1)
    done = manager.load(step, blank(s))
    return slowest(time.perf_counter() - start), done.bytes_read_all


def per_replica(manager: CheckpointManager, s: dict) -> tuple[float, int]:
    start, folder = time.perf_counter(), step_dir(manager.root, 1)
    checked = 0
    if dist.get_rank() == 0:
        checked = verify(folder).nbytes  # newest_valid before the single read: every file re-read for its CRC
    dist.barrier()
    reader = CountingReader(folder, thread_count=manager.io_threads)
    dcp.load(blank(s), storage_reader=reader, planner=ExactLoadPlanner())
    return slowest(time.perf_counter() - start), summed(checked + reader.bytes_read)


def rank_main(rank: int, world: int, folder: str, mb: int, rounds: int) -> dict:
    s = state(mb)
    manager = CheckpointManager(folder, keep=1, pinned=set())
    manager.save(1, s)
    manager.wait()
    files = sorted(step_dir(manager.root, 1).iterdir())
    size = read_manifest(step_dir(manager.root, 1)).nbytes
    out: dict[str, list] = {"single": [], "per_replica": []}
    for r in range(rounds):
        for kind in ("single", "per_replica") if r % 2 == 0 else ("per_replica", "single"):
            dist.barrier()
            if rank == 0:
                drop_cache(files)
            dist.barrier()
            out[kind].append((single_read if kind == "single" else per_replica)(manager, s))
    manager.close()
    return {"size": size, **out}


def report(runs: dict[int, dict]) -> dict:
    result: dict[str, dict] = {}
    for kind in ("single", "per_replica"):
        rows = {}
        for dp, run in runs.items():
            seconds = [t for t, _ in run[kind][1:]]
            read = run[kind][-1][1]
            rows[f"dp{dp}"] = {
                "load_s": round(median(seconds), 3),
                "bytes_read": read,
                "bytes_over_checkpoint": round(read / run["size"], 3),
            }
        base = rows["dp1"]["load_s"]
        for row in rows.values():
            row["load_over_dp1"] = round(row["load_s"] / base, 3)
        result[kind] = rows
    dp4 = result["single"]["dp4"]
    result["goals"] = {
        "dp4_bytes_over_checkpoint <= 1.1": dp4["bytes_over_checkpoint"] <= 1.1,
        "dp4_load_over_dp1 <= 1.25": dp4["load_over_dp1"] <= 1.25,
    }
    result["checkpoint_bytes"] = {f"dp{dp}": run["size"] for dp, run in runs.items()}
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="24 MB, 3 rounds")
    parser.add_argument("--mb", type=int, default=128, help="the replicated state's size")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--dir", default=None, help="where the checkpoints go (default: the system's temp folder)")
    args = parser.parse_args()
    mb, rounds = (24, 3) if args.quick else (args.mb, args.rounds)
    work = Path(tempfile.mkdtemp(prefix="checkpoint_load_", dir=args.dir))
    try:
        runs = {}
        for dp in DPS:
            log(f"dp{dp}: {mb} MB replicated, {rounds} rounds")
            runs[dp] = run_ranks(rank_main, dp, str(work / f"dp{dp}"), mb, rounds)[0]
        emit({"benchmark": "checkpoint_load", "state_mb": mb, "rounds": rounds, **report(runs)})
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
