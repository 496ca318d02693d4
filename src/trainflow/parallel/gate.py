"""The collective gate's patterns: each kind of collective training runs, timed on the groups of its own mesh.

    rows = time_patterns(dims, mesh, nbytes=16 << 20, iters=5, device=device)   # on every rank
    table, exclude = judge(rows_of_every_rank, hosts, thresholds)                 # on rank 0

| pattern           | groups         | what training sends there                       | busbw / algbw (nccl-tests) |
| dp_all_reduce     | data parallel  | replicated gradients (DDP, GradReducer; HSDP)  | 2 (n - 1) / n              |
| dp_reduce_scatter | data parallel  | FSDP's gradient reduction                       | (n - 1) / n                |
| dp_all_gather     | data parallel  | FSDP's parameter gathers                        | (n - 1) / n                |
| tp_all_reduce     | tensor parallel| the row-parallel outputs inside every block     | 2 (n - 1) / n              |
| pp_send_recv      | pipeline       | activations and their gradients between stages  | 1                          |

Every group of a pattern runs at once, as in training, so a slow link shows in the groups that cross it.
algbw = bytes / time (reduce_scatter and all_gather: the whole buffer's bytes, as nccl-tests counts them);
a group's time is its slowest member's. send/recv is a ring inside each pipeline group: every stage sends
to the next and receives from the previous (nccl-tests' sendrecv_perf).
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from statistics import median

import torch
import torch.distributed as dist
from torch.distributed.device_mesh import DeviceMesh

from trainflow.config.layout import ParallelDims
from trainflow.config.cluster import GATE_PATTERNS


@dataclass(frozen=True)
class Pattern:
    dim: str
    """The mesh dimension whose groups run it."""
    op: str

    def bus_factor(self, n: int) -> float:
        return bus_factor(self.op, n)


def bus_factor(op: str, n: int) -> float:
    """nccl-tests' correction from algorithm to bus bandwidth of `op` over n ranks (send/recv: 1)."""
    return {"all_reduce": 2 * (n - 1) / n, "reduce_scatter": (n - 1) / n, "all_gather": (n - 1) / n}.get(op, 1)


PATTERNS = {name: Pattern(name[:2], name[3:]) for name in GATE_PATTERNS}  # <mesh dim>_<op>


def patterns_of(dims: ParallelDims) -> list[str]:
    """The patterns a layout runs: those whose groups have more than one rank (FSDP's only under shard)."""
    sizes = {"dp": dims.dp, "tp": dims.tp, "pp": dims.pp}
    fsdp = dims.dp_mode == "shard"
    return [name for name, p in PATTERNS.items() if sizes[p.dim] > 1 and (p.op in ("all_reduce", "send_recv") or fsdp)]


def run_once(pattern: Pattern, group: dist.ProcessGroup, ranks: list[int], buffers: tuple[torch.Tensor, ...]) -> None:
    """One collective of `pattern` in `group` (ranks: its global ranks); buffers: whole, one shard, a spare whole."""
    whole, shard, spare = buffers
    n, me = len(ranks), ranks.index(dist.get_rank())
    if pattern.op == "all_reduce":
        dist.all_reduce(whole, group=group)
    elif pattern.op == "reduce_scatter":
        dist.reduce_scatter_tensor(shard, whole, group=group)
    elif pattern.op == "all_gather":
        dist.all_gather_into_tensor(whole, shard, group=group)
    else:
        ops = [
            dist.P2POp(dist.isend, whole, ranks[(me + 1) % n], group=group),
            dist.P2POp(dist.irecv, spare, ranks[(me - 1) % n], group=group),
        ]
        for work in dist.batch_isend_irecv(ops):
            work.wait()


def time_patterns(dims: ParallelDims, mesh: DeviceMesh, *, nbytes: int, iters: int, device: torch.device) -> list[dict]:
    """This rank's median time of each of the layout's patterns on a message of about `nbytes` (after a warm-up)."""
    rows = []
    for name in patterns_of(dims):
        pattern = PATTERNS[name]
        sub = mesh[pattern.dim]
        group, n = sub.get_group(), sub.size()
        ranks = dist.get_process_group_ranks(group)
        numel = max(nbytes // 4 // n, 1) * n
        buffers = tuple(torch.ones(size, device=device) for size in (numel, numel // n, numel))
        run_once(pattern, group, ranks, buffers)  # warm-up: connection setup
        times = []
        for _ in range(iters):
            dist.barrier(group=group)
            start = time.perf_counter()
            run_once(pattern, group, ranks, buffers)
            if device.type == "cuda":
                torch.cuda.synchronize()
            times.append(time.perf_counter() - start)
        rows.append({"pattern": name, "group": ranks, "bytes": numel * 4, "time_s": median(times)})
    return rows


def judge(rows: list[list[dict]], hosts: list[str], thresholds: dict[str, float]) -> tuple[list[dict], list[str]]:
    """Per pattern, from every rank's rows: its groups' bus bandwidth (a group's time is its slowest member's),
    the slowest group and its hosts, and the verdict against thresholds[pattern] (GB/s; absent: reported
    only). Also the exclude list: the hosts of the slowest group of every pattern below its threshold."""
    times: dict[str, dict[tuple[int, ...], float]] = {}
    sizes: dict[str, int] = {}
    for rank_rows in rows:
        for r in rank_rows:
            groups = times.setdefault(r["pattern"], {})
            key = tuple(r["group"])
            groups[key] = max(groups.get(key, 0.0), r["time_s"])
            sizes[r["pattern"]] = r["bytes"]
    table, exclude = [], set()
    for name, groups in times.items():
        slowest, t = max(groups.items(), key=lambda kv: kv[1])
        n, size = len(slowest), sizes[name]
        busbw = size / t / 1e9 * PATTERNS[name].bus_factor(n)
        threshold = thresholds.get(name)
        passed = None if threshold is None else busbw >= threshold
        slow_hosts = sorted({hosts[r] for r in slowest})
        table.append(
            {
                "pattern": name,
                "groups": len(groups),
                "group_size": n,
                "bytes": size,
                "slowest_group": list(slowest),
                "slowest_hosts": slow_hosts,
                "time_s": t,
                "busbw_gbps": busbw,
                "threshold_gbps": threshold,
                "passed": passed,
            }
        )
        if passed is False:
            exclude |= set(slow_hosts)
    return table, sorted(exclude)
