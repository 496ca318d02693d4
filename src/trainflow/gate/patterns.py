"""The collectives training runs, each timed on the groups of its own mesh dimension, and the all_reduce sweep over
the whole world, which is one more pattern.

    rows = time_patterns(dims, mesh, nbytes=16 << 20, iters=5, device=device)   # on every rank
    table, exclude, everywhere = judge(rows_of_every_rank, hosts, thresholds)     # on rank 0

| pattern           | groups           | what training sends there                      | busbw / algbw (nccl-tests) |
| world_all_reduce  | the whole world  | (the sweep: the network as a whole)            | 2 (n - 1) / n              |
| dp_all_reduce     | data parallel    | replicated gradients (DDP, GradReducer; HSDP)  | 2 (n - 1) / n              |
| dp_reduce_scatter | data parallel    | FSDP's gradient reduction                      | (n - 1) / n                |
| dp_all_gather     | data parallel    | FSDP's parameter gathers                       | (n - 1) / n                |
| tp_all_reduce     | tensor parallel  | the row-parallel outputs inside every block    | 2 (n - 1) / n              |
| pp_send_recv      | pipeline         | activations and their gradients between stages | 1                          |
| cp_all_gather     | context parallel | every layer's K and V (backward: reduce-scatter) | (n - 1) / n              |

Under context parallel the dp patterns run on dp x cp (parallel.mesh.batch_mesh), where training reduces the
gradients. Every group of a pattern runs at once, as in training, so a slow link shows in the groups that cross it.
algbw = bytes / time (reduce_scatter and all_gather: the whole buffer's bytes, as nccl-tests counts them);
a group's time is its slowest member's. send/recv is a ring inside each pipeline group: every stage sends
to the next and receives from the previous (nccl-tests' sendrecv_perf).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.distributed as dist
from torch.distributed.device_mesh import DeviceMesh

from trainflow.config.cluster import GATE_PATTERNS
from trainflow.config.layout import ParallelDims
from trainflow.errors import TrainflowError
from trainflow.gate.report import PatternRow, SweepRow
from trainflow.parallel.mesh import batch_mesh
from trainflow.parallel.timing import median_seconds


@dataclass(frozen=True)
class Pattern:
    dim: str
    """The mesh dimension whose groups run it (world: the default process group)."""
    op: str

    def bus_factor(self, n: int) -> float:
        return bus_factor(self.op, n)


def bus_factor(op: str, n: int) -> float:
    """nccl-tests' correction from algorithm to bus bandwidth of `op` over n ranks (send/recv: 1)."""
    return {"all_reduce": 2 * (n - 1) / n, "reduce_scatter": (n - 1) / n, "all_gather": (n - 1) / n}.get(op, 1)


PATTERNS = {name: Pattern(name[:2], name[3:]) for name in GATE_PATTERNS}  # <mesh dim>_<op>
WORLD = Pattern("world", "all_reduce")


def patterns_of(dims: ParallelDims) -> list[str]:
    """The patterns a layout runs: those whose groups have more than one rank (FSDP's only under shard)."""
    sizes = {"dp": dims.dp * dims.cp, "tp": dims.tp, "pp": dims.pp, "cp": dims.cp}
    fsdp = dims.fsdp_enabled
    runs = ("all_reduce", "send_recv")
    return [name for name, p in PATTERNS.items() if sizes[p.dim] > 1 and (p.op in runs or fsdp or p.dim == "cp")]


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


def time_pattern(
    pattern: Pattern, group: dist.ProcessGroup, *, nbytes: int, iters: int, device: torch.device
) -> tuple[float, int, torch.Tensor]:
    """This rank's median seconds of `pattern` in `group` on a message of about `nbytes` (after one warm-up), the
    message's bytes, and the whole buffer as the collectives left it."""
    ranks = dist.get_process_group_ranks(group)
    n = len(ranks)
    numel = max(nbytes // 4 // n, 1) * n
    buffers = tuple(torch.ones(size, device=device) for size in (numel, numel // n, numel))
    seconds = median_seconds(lambda: run_once(pattern, group, ranks, buffers), group=group, iters=iters, device=device)
    return seconds, numel * 4, buffers[0]


def time_patterns(dims: ParallelDims, mesh: DeviceMesh, *, nbytes: int, iters: int, device: torch.device) -> list[dict]:
    """This rank's median time of each of the layout's patterns on its groups (rows for `judge`)."""
    rows = []
    for name in patterns_of(dims):
        dim = PATTERNS[name].dim
        group = (batch_mesh(dims, mesh) if dim == "dp" else mesh[dim]).get_group()
        seconds, size, _ = time_pattern(PATTERNS[name], group, nbytes=nbytes, iters=iters, device=device)
        rows.append({"pattern": name, "group": dist.get_process_group_ranks(group), "bytes": size, "time_s": seconds})
    return rows


def sweep(sizes_mb: list[float], *, iters: int, device: torch.device) -> list[SweepRow]:
    """The all_reduce sweep over the whole world, one row per message size; a sum that comes back wrong (every
    rank adds ones, once per all_reduce in place) is a broken collective, not a slow one."""
    world, rows = dist.get_world_size(), []
    group = dist.group.WORLD
    for mb in sizes_mb:
        seconds, size, buf = time_pattern(WORLD, group, nbytes=int(mb * 2**20), iters=iters, device=device)
        expected = float(world ** (iters + 1))  # the warm-up and every timed all_reduce
        if not torch.allclose(buf[:1].cpu(), torch.tensor([expected])):
            raise TrainflowError(
                f"all_reduce of {size} bytes returned {buf[0].item()}, expected {expected}: the collective is broken"
            )
        algbw = size / seconds / 1e9
        rows.append(SweepRow(size, seconds, algbw, algbw * WORLD.bus_factor(world)))
    return rows


def judge(
    rows: list[list[dict]], hosts: list[str], thresholds: dict[str, float]
) -> tuple[list[PatternRow], list[str], list[str]]:
    """Per pattern, from every rank's rows: its groups' bus bandwidth (a group's time is its slowest member's),
    the slowest group and its hosts, and the verdict against thresholds[pattern] (GB/s; absent: reported
    only). Also the exclude list: the hosts of the slowest group of every pattern below its threshold that another
    of its groups meets; and the patterns none of whose groups meets it. Those blame no host: a threshold no group
    reaches is one the layout cannot meet (the seed's tp8 over 4-GPU nodes: every tp group crosses the network, so
    an in-node tp_all_reduce gate of 200 GB/s would leave out the two healthy hosts of whichever group came last),
    and one group alone has nothing to be slow against."""
    times: dict[str, dict[tuple[int, ...], float]] = {}
    sizes: dict[str, int] = {}
    for rank_rows in rows:
        for r in rank_rows:
            groups = times.setdefault(r["pattern"], {})
            key = tuple(r["group"])
            groups[key] = max(groups.get(key, 0.0), r["time_s"])
            sizes[r["pattern"]] = r["bytes"]
    table, exclude, everywhere = [], set(), []
    for name, groups in times.items():
        slowest, t = max(groups.items(), key=lambda kv: kv[1])
        n, size = len(slowest), sizes[name]
        busbw = size / t / 1e9 * PATTERNS[name].bus_factor(n)
        threshold = thresholds.get(name)
        passed = None if threshold is None else busbw >= threshold
        slow_hosts = sorted({hosts[r] for r in slowest})
        table.append(PatternRow(name, len(groups), n, size, list(slowest), slow_hosts, t, busbw, threshold, passed))
        if passed is False:
            fastest = size / min(groups.values()) / 1e9 * PATTERNS[name].bus_factor(n)
            if fastest >= threshold:
                exclude |= set(slow_hosts)
            else:
                everywhere.append(name)
    return table, sorted(exclude), everywhere
