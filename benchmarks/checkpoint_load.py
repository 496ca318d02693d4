"""A job start's checkpoint load at dp1, dp2 and dp4: the bytes read from the checkpoint's files, the time, each rank's
CPU seconds and where the time goes, the single read (checkpoint.single_read, what CheckpointManager.load does: the
ranks of one host exchange through its memory) beside the same exchanging over gloo (as ranks on separate hosts do),
each replica reading its own copy (the load before it: rank 0 re-reads every file for its CRC, then DCP reads every
rank's plan from the files) and gloo's bare exchange of the same bytes.

    python benchmarks/checkpoint_load.py [--quick] [--mb 96 384] [--rounds 7] [--dir /tmp]

Goals (issues 32 and 44): at dp4, bytes read per job start <= 1.1 x the checkpoint's size, and each rank's bytes read,
sent (to each rank that needs what it read and cannot map it) and had from the others (received, or mapped from its
host's memory) <= 1.1 x its ideal share (`ideal_per_rank_bytes`: 1/N of the checkpoint read, (N - 1)/N sent and had;
the largest over the group's ranks, `per_rank_bytes`, against it in `per_rank_over_ideal`). The times beside dp1's
(`s_over_dp1`, and `per_byte`: the growth of the time from the smaller state to the larger) are figures, no longer a
goal: on this 2-core VM they measure the cores more than the load.

The replicated state is each `--mb` MB of fp32 tensors of 4 MB (a dp replica's model and AdamW moments). The dp4 run's
checkpoint is saved by CheckpointManager in the 4-rank world the loads run in; a dp1 and a dp2 run's own (a dp1 run
saves 2 files of 1/2 of the state, a dp4 run 8 of 1/8) each in a world of its size, except under --quick, which loads
the dp4 run's only. Each dp loads the dp4 run's checkpoint and its own (SAVED).
The loads then run in one world of 4 gloo ranks (CPU): dpN is its first N ranks' group, so dp1, dp2 and dp4
interleave round by round, in reverse order every other round, and see the same machine; the ranks outside a load's
group wait at a barrier. Before each load rank 0 drops the checkpoint's files from this kernel's page cache (fsync +
posix_fadvise(DONTNEED)); a load is rank 0 of the group checking the manifest, then the load into the state's tensors,
built and written before the rounds as a job's model and optimizer state are (zeroed before each load, checked equal
after); its time is the slowest rank's. A job start runs in fresh processes, whose buffers are fresh memory (this VM's
host backs it at 0.25-0.8 GB/s): glibc would recycle freed buffers under 32 MB from round to round, so the ranks run
with MALLOC_MMAP_THRESHOLD_ fixed at 1 MB and every buffer of 1 MB or more is fresh in every round. The single read's
bytes are the reader's own counter; the per-replica load's are rank 0's CRC pass plus the bytes of the records each
rank's DCP plan reads; after that pass its repeats come from this kernel's page cache, which replicas on separate nodes
do not share. `exchange_floor` is gloo's batch_isend_irecv of the bytes the single read exchanges (each rank's 1/N of
the state to every peer, into written memory), nothing else. Times are medians of the rounds after the first; CPU
seconds (time.process_time: all of a rank's threads, gloo's included) are summed over a group's ranks.
"""

from __future__ import annotations

import argparse
import ctypes
import os
import shutil
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from _common import drop_cache, emit, log, median, run_ranks

from trainflow.checkpoint.checked_read import read_checked
from trainflow.checkpoint.host_shared import SharedBytes, mapped
from trainflow.checkpoint.manager import CheckpointManager, step_dir
from trainflow.checkpoint.manifest import METADATA, check_complete, read_manifest, verify
from trainflow.checkpoint.reader import ExactLoadPlanner, InPlaceReader
from trainflow.checkpoint.single_read import PHASES, SingleReader

DPS = (1, 4, 2)
"""The order of a round's loads (reversed every other round): dp1 and dp4 side by side."""
SAVED = (f"dp{max(DPS)}", "own")
"""Which checkpoint each load reads: the one the dp4 run saved, at every dp (the same files and bytes: only the load's
parallelism changes), and each dpN's own, as a job start after a dpN run reads it (not under --quick)."""
TENSOR_MB = 4
KINDS = ("single", "single_over_group", "per_replica", "bare_read", "bare_pull", "exchange_floor")
"""The single read as CheckpointManager.load runs it (the ranks of this host exchange through its memory); the same
over gloo, as ranks on separate hosts exchange; each replica reading its own copy; the single read's bare work (what
any load of one copy into every replica must do here, the floor it is held against), through a memfd as the load
shares, and pulled from the reader's own memory by process_vm_readv; gloo's bare exchange."""
STATE_LOADS = ("single", "single_over_group", "per_replica")
"""The kinds that load the state (checked equal to the saved one after each load)."""


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
    return {k: blank(v) if isinstance(v, dict) else torch.zeros_like(v) for k, v in like.items()}


def floor_buffers(rank: int, dp: int, share: int) -> tuple[torch.Tensor, dict[int, torch.Tensor]]:
    """What the bare exchange sends (this rank's 1/dp of the state) and where each peer's share lands (written)."""
    return torch.ones(share, dtype=torch.uint8), {
        p: torch.zeros(share, dtype=torch.uint8) for p in range(dp) if p != rank
    }


def tensors(s: dict) -> list[torch.Tensor]:
    return [t for v in s.values() for t in (tensors(v) if isinstance(v, dict) else [v])]


def save_main(rank: int, world: int, folder: str, mb: int) -> int:
    manager = CheckpointManager(folder, keep=1, pinned=set())
    manager.save(1, state(mb))
    manager.wait()
    manager.close()
    return read_manifest(step_dir(Path(folder), 1)).nbytes


def reduced(value: float, group: dist.ProcessGroup, op: dist.ReduceOp) -> float:
    t = torch.tensor(value, dtype=torch.float64)
    dist.all_reduce(t, op=op, group=group)
    return float(t)


def single_read(folder: Path, dest: dict, group: dist.ProcessGroup, *, host_memory: bool = True):
    chosen = torch.tensor(-1)
    if dist.get_rank(group) == 0:  # CheckpointManager.newest_complete: the manifest only
        check_complete(folder, read_manifest(folder))
        chosen.fill_(1)
    dist.broadcast(chosen, group=group, group_src=0)
    reader = SingleReader(folder, manifest=read_manifest(folder), thread_count=2, group=group, host_memory=host_memory)
    dcp.load(dest, storage_reader=reader, planner=ExactLoadPlanner(), process_group=group)
    t = reader.tally
    moved = {"read": t.bytes_read, "sent": t.bytes_sent, "received": t.bytes_received + t.bytes_mapped}
    return t.bytes_read, t.seconds, moved


def per_replica(folder: Path, dest: dict, group: dist.ProcessGroup) -> tuple[int, dict]:
    checked = verify(folder).nbytes if dist.get_rank(group) == 0 else 0  # every file re-read for its CRC
    dist.barrier(group=group)
    reader = CountingReader(folder, thread_count=2)
    dcp.load(dest, storage_reader=reader, planner=ExactLoadPlanner(), process_group=group)
    return checked + reader.bytes_read, {}, {}


class IoVec(ctypes.Structure):
    _fields_ = [("base", ctypes.c_void_p), ("len", ctypes.c_size_t)]


LIBC = ctypes.CDLL(None, use_errno=True)
LIBC.process_vm_readv.restype = ctypes.c_ssize_t


def pulled(pid: int, address: int, into: torch.Tensor) -> None:
    """`into.numel()` bytes at `address` in process `pid` copied into `into` by process_vm_readv (Linux's cross-memory
    attach, MPI's CMA; Python has no binding)."""
    done, size = 0, into.numel()
    while done < size:
        local, remote = IoVec(into.data_ptr() + done, size - done), IoVec(address + done, size - done)
        if (n := LIBC.process_vm_readv(pid, ctypes.byref(local), 1, ctypes.byref(remote), 1, 0)) <= 0:
            raise OSError(ctypes.get_errno(), f"process_vm_readv from process {pid}")
        done += n


def bare_read(folder: Path, sink: torch.Tensor, group: dist.ProcessGroup, *, pull: bool) -> tuple[int, dict]:
    """The single read's bare work at dpN: each rank reads and checks its 1/N of the files (read_checked, 2 threads)
    into memory its host shares (checkpoint.host_shared; at dp1, or where peers `pull`, its own fresh memory), the
    ranks gather where it is (one collective), and every rank copies every file into `sink` (written memory, as the
    state is): from a mapping of the memfd, or pulled (process_vm_readv); a barrier, so no reader frees what a peer
    still copies. No DCP, no records parsed, no plan."""
    rank, n = dist.get_rank(group), dist.get_world_size(group)
    files = read_manifest(folder).files
    names = sorted(name for name in files if name != METADATA)
    mine = names[rank::n]
    shared = {name: SharedBytes(files[name].bytes) for name in mine} if n > 1 and not pull else {}
    into = {name: shared[name].tensor if shared else None for name in mine}
    with ThreadPoolExecutor(max_workers=2) as pool:
        read = lambda name: read_checked(folder / name, files[name], directory=folder, into=into[name])  # noqa: E731
        held = dict(zip(mine, pool.map(read, mine), strict=True))
    where = {name: s.address for name, s in shared.items()} or {
        name: (os.getpid(), t.data_ptr()) for name, t in held.items()
    }
    addresses: list = [None] * n
    dist.all_gather_object(addresses, where, group=group)
    at, near = 0, {name: a for peer in addresses for name, a in peer.items()}
    for name in (name for name in names if files[name].bytes):  # an empty file (a rank that saved nothing) maps not
        size = files[name].bytes
        if name in held:
            sink[at : at + size].copy_(held[name])
        elif pull:
            pulled(*near[name], sink[at : at + size])
        else:
            sink[at : at + size].copy_(mapped(near[name]))
        at += size
    dist.barrier(group=group)
    for s in shared.values():
        s.unshare()
    return sum(files[name].bytes for name in mine), {}, {}


def exchange_floor(mine: torch.Tensor, into: dict[int, torch.Tensor], group: dist.ProcessGroup) -> tuple[int, dict]:
    ops = [dist.P2POp(dist.isend, mine, group=group, group_peer=p) for p in into]
    ops += [dist.P2POp(dist.irecv, t, group=group, group_peer=p) for p, t in into.items()]
    for work in dist.batch_isend_irecv(ops):
        work.wait()
    return 0, {}, {}


def timed(kind: str, dp: int, folder: Path, dest: dict, floor: dict, sink: torch.Tensor, group: dist.ProcessGroup):
    """One load (or bare exchange) on `group`: its slowest rank's time, this group's bytes read and CPU seconds."""
    for t in tensors(dest):
        t.zero_()
    dist.barrier(group=group)
    start, cpu = time.perf_counter(), time.process_time()
    if kind == "exchange_floor":
        read, phases, moved = exchange_floor(*floor[dp], group)
    elif kind == "per_replica":
        read, phases, moved = per_replica(folder, dest, group)
    elif kind.startswith("bare_"):
        read, phases, moved = bare_read(folder, sink, group, pull=kind == "bare_pull")
    else:
        read, phases, moved = single_read(folder, dest, group, host_memory=kind == "single")
    wall, cpu = time.perf_counter() - start, time.process_time() - cpu
    row = {"s": reduced(wall, group, dist.ReduceOp.MAX), "cpu_s": reduced(cpu, group, dist.ReduceOp.SUM)}
    row["bytes_read"] = int(reduced(read, group, dist.ReduceOp.SUM))
    if moved:  # the single read's counters: the most any rank of the group read, sent, had from the others
        row["per_rank_bytes"] = {k: int(reduced(v, group, dist.ReduceOp.MAX)) for k, v in moved.items()}
    if phases:  # each phase's mean over the ranks; "plan": the rest (the manifest's check, .metadata, DCP's plans and
        # collectives, the wait for the group's slowest rank)
        phases = {p: reduced(phases[p], group, dist.ReduceOp.SUM) / dp for p in PHASES}
        row["phases_s"] = {"plan": row["s"] - sum(phases.values()), **phases}
    return row


def loads(saved_kinds: tuple[str, ...]) -> list[tuple[str, str, int]]:
    """A round's loads: (SAVED, KINDS, dp); the bare exchange, which reads no checkpoint, once per dp past 1."""
    out = [(saved, kind, dp) for saved in saved_kinds for kind in KINDS if kind != "exchange_floor" for dp in DPS]
    return out + [(SAVED[0], "exchange_floor", dp) for dp in DPS if dp != 1]


def load_main(rank: int, world: int, work: str, mb: int, rounds: int, saved_kinds: tuple[str, ...]) -> dict:
    """Save the dp4 run's checkpoint in this world of 4 ranks, then run `rounds` rounds of loads."""
    groups = {dp: dist.new_group(list(range(dp))) for dp in DPS}  # every rank makes every group
    s = state(mb)
    save_main(rank, world, str(Path(work, SAVED[0])), mb)
    dest = blank(s)  # written: a job's model and optimizer state exist before its load
    floor = {dp: floor_buffers(rank, dp, mb * (1 << 20) // dp) for dp in DPS if rank < dp}
    sink = torch.ones(max(read_manifest(step_dir(p, 1)).nbytes for p in Path(work).iterdir()), dtype=torch.uint8)
    out = {saved: {kind: {dp: [] for dp in DPS} for kind in KINDS} for saved in saved_kinds}
    for r in range(rounds):
        for saved, kind, dp in loads(saved_kinds) if r % 2 == 0 else loads(saved_kinds)[::-1]:
            folder = step_dir(Path(work, saved if saved != "own" else f"dp{dp}"), 1)
            dist.barrier()
            if rank == 0:
                drop_cache(sorted(folder.iterdir()))
            dist.barrier()
            if rank < dp:
                row = timed(kind, dp, folder, dest, floor, sink, groups[dp])
                if kind in STATE_LOADS and not all(torch.equal(a, b) for a, b in zip(tensors(dest), tensors(s))):
                    raise AssertionError(f"the {kind} load at dp{dp} did not restore the state")
                out[saved][kind][dp].append(row)
    return out


def ideal(size: int, dp: int) -> dict[str, int]:
    """A rank's ideal share of a single read of `size` bytes at dpN: it reads 1/N of them and sends what it read to
    each of the other N - 1 ranks ((N - 1)/N on the wire, what each rank of a ring broadcast sends too), and has the
    other (N - 1)/N from the other ranks (received, or mapped from its host's memory)."""
    return {"read": size // dp, "sent": size * (dp - 1) // dp, "received": size * (dp - 1) // dp}


def summary(rows: list[dict], size: int, dp: int) -> dict:
    timed_rows = rows[1:]  # the first round warms the code paths
    out = {
        "s": round(median([r["s"] for r in timed_rows]), 3),
        "s_rounds": [round(r["s"], 3) for r in timed_rows],
        "cpu_s_all_ranks": round(median([r["cpu_s"] for r in timed_rows]), 3),
    }
    if size:
        out |= {"bytes_read": rows[-1]["bytes_read"], "bytes_over_checkpoint": round(rows[-1]["bytes_read"] / size, 3)}
    if size and "per_rank_bytes" in rows[-1]:
        best = ideal(size, dp)
        out["per_rank_bytes"], out["ideal_per_rank_bytes"] = rows[-1]["per_rank_bytes"], best
        out["per_rank_over_ideal"] = {k: round(v / max(best[k], 1), 3) for k, v in rows[-1]["per_rank_bytes"].items()}
    if "phases_s" in rows[-1]:
        out["phases_s"] = {p: round(median([r["phases_s"][p] for r in timed_rows]), 3) for p in rows[-1]["phases_s"]}
    return out


def report(out: dict, sizes: dict[int, int]) -> dict:
    """One checkpoint's loads (`out`: by kind and dp) against the checkpoint's bytes (`sizes`: by dp)."""
    result: dict[str, dict] = {}
    for kind in KINDS:
        rows = {
            f"dp{dp}": summary(out[kind][dp], sizes[dp] * (kind != "exchange_floor"), dp)
            for dp in sorted(DPS)
            if out[kind][dp]
        }
        if kind != "exchange_floor":
            for dp in sorted(DPS):  # the ratio of medians, and the median of each round's own ratio (same minute)
                pairs = zip(out[kind][dp][1:], out[kind][1][1:], strict=True)
                rows[f"dp{dp}"]["s_over_dp1"] = round(rows[f"dp{dp}"]["s"] / rows["dp1"]["s"], 3)
                rows[f"dp{dp}"]["s_over_dp1_paired"] = round(median([a["s"] / b["s"] for a, b in pairs]), 3)
        result[kind] = rows
    result["checkpoint_bytes"] = {f"dp{dp}": sizes[dp] for dp in sorted(DPS)}
    return result


def reports(out: dict, sizes: dict[int, int]) -> dict:
    """report() for each checkpoint loaded (`out`'s keys)."""
    dp4 = dict.fromkeys(DPS, sizes[max(DPS)])
    return {saved: report(out[saved], sizes if saved == "own" else dp4) for saved in out}


def per_byte(small: dict, large: dict, kind: str = "single") -> dict:
    """What each further byte of the state costs a load at dp2 and dp4 against dp1: the medians' difference between
    the two sizes, over the bytes between them. Fixed costs (the group's collectives, 4-5 ms each among 4 ranks on
    2 cores) drop out, as they do from a campaign's load of hundreds of GB."""
    grew = {dp: large[kind][f"dp{dp}"]["s"] - small[kind][f"dp{dp}"]["s"] for dp in sorted(DPS)}
    return {f"dp{dp}_over_dp1": round(grew[dp] / grew[1], 3) for dp in sorted(DPS) if dp != 1}


def goals(results: dict[int, dict], saved_kinds: tuple[str, ...]) -> dict:
    """Issues 32 and 44's goals, for each checkpoint loaded: at dp4, the bytes read per job start within 1.1 x the
    checkpoint's size, and each rank's bytes read, sent and had from the others within 1.1 x its ideal share."""
    out = {}
    for saved in saved_kinds:
        for mb, result in results.items():
            dp4 = result[saved]["single"]["dp4"]
            out[f"dp4_bytes_over_checkpoint <= 1.1 ({mb} MB, {saved})"] = dp4["bytes_over_checkpoint"] <= 1.1
            for kind in ("single", "single_over_group"):
                worst = max(result[saved][kind]["dp4"]["per_rank_over_ideal"].values())
                out[f"dp4_per_rank_bytes_over_ideal <= 1.1 ({mb} MB, {saved}, {kind})"] = worst <= 1.1
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="32 MB, 2 rounds, the dp4 run's checkpoint only")
    parser.add_argument("--mb", type=int, nargs="+", default=[96, 384], help="the replicated state's sizes")
    parser.add_argument("--rounds", type=int, default=7, help="rounds, the first of which is not timed")
    parser.add_argument("--dir", default=None, help="where the checkpoints go (default: the system's temp folder)")
    args = parser.parse_args()
    mbs, rounds = ([32], 2) if args.quick else (sorted(set(args.mb)), args.rounds)
    saved_kinds = SAVED[:1] if args.quick else SAVED
    os.environ["MALLOC_MMAP_THRESHOLD_"] = str(1 << 20)  # the ranks' buffers fresh in every round (the docstring)
    results = {}
    for mb in mbs:
        work = Path(tempfile.mkdtemp(prefix="checkpoint_load_", dir=args.dir))
        try:
            own = [dp for dp in sorted(DPS) if dp != max(DPS) and "own" in saved_kinds]  # dp4's saves in the load world
            sizes = {dp: run_ranks(save_main, dp, str(work / f"dp{dp}"), mb)[0] for dp in own}
            log(f"saved {mb} MB at {', '.join(f'dp{dp}' for dp in own) or 'no other dp'}; dp4 then {rounds} rounds")
            out = run_ranks(load_main, max(DPS), str(work), mb, rounds, saved_kinds)[0]
            sizes[max(DPS)] = read_manifest(step_dir(work / SAVED[0], 1)).nbytes
            results[mb] = reports(out, sizes)
        finally:
            shutil.rmtree(work, ignore_errors=True)
    kinds = [kind for kind in KINDS if kind != "exchange_floor"]  # the floor has no dp1 to hold it against
    slopes = {
        saved: {kind: per_byte(results[mbs[0]][saved], results[mbs[-1]][saved], kind) for kind in kinds}
        for saved in saved_kinds
        if len(mbs) > 1
    }
    emit(
        {
            "benchmark": "checkpoint_load",
            "rounds": rounds - 1,
            "state_mb": {str(mb): result for mb, result in results.items()},
            "per_byte": slopes,
            "goals": goals(results, saved_kinds),
        }
    )


if __name__ == "__main__":
    main()
