"""The seed's tuning checklist, each item measured on this run or marked not applicable with the reason, never
assumed: collective bandwidth, GPU utilisation, MFU, swap, NVLink, the node settings validate_nccl read, the
profiler trace, and the leak check.

    rows = checklist(nccl, segments, energy, cluster=cfg.cluster, leak_mb=cfg.observe.leak_mb)
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from trainflow.config import ClusterConfig
from trainflow.energy.phases import mean_gpu_busy_pct
from trainflow.energy.report import EnergyReport
from trainflow.gate.report import HostFacts, NcclReport, Stripes
from trainflow.train.summary import ProfileSummary, SegmentSummary


def checklist(
    nccl: NcclReport,
    segments: Sequence[SegmentSummary],
    energy: EnergyReport,
    *,
    cluster: ClusterConfig,
    leak_mb: float,
) -> list[list[str]]:
    """Rows of [item, measured, status]."""
    summary = segments[-1]
    busy = mean_gpu_busy_pct([trace for seg in energy.segments for trace in seg.power_traces])
    best = nccl.sweep[-1].busbw_gbps if nccl.sweep else None
    gpu, gate = cluster.runtime.device == "cuda", cluster.gate.min_busbw_gbps
    swap = [h.node.no_swapping for h in nccl.hosts]
    return [
        [
            f"collective bandwidth >= {gate:g} GB/s (cluster.gate.min_busbw_gbps)",
            f"{best:.3f} GB/s" if best is not None else "world size 1",
            "n/a" if best is None else ("pass" if best >= gate else "FAIL"),
        ],
        [
            "GPU utilisation >= 90 % (NVML's busy time over the segments' power samples, not MFU)",
            "-" if busy is None else f"{busy:.1f} %",
            ("n/a (CPU)" if not gpu else "no NVML samples") if busy is None else ("pass" if busy >= 90 else "FAIL"),
        ],
        ["model FLOPs utilisation (MFU)", f"{summary.speed.mfu:.1%} of cluster.hardware.peak_tflops", "info"],
        [
            "no host swapping",
            f"swap used {[h.node.swap_used_kb for h in nccl.hosts]} kB",
            "pass" if all(swap) else "FAIL",
        ],
        ["NVLink utilisation monitored", "-", "n/a (CPU)" if not gpu else "see NVML counters"],
        *node_rows(nccl.hosts, nccl.checkpoint_stripes),
        profiled(summary.profile),
        leak_check(segments, leak_mb),
    ]


def node_rows(hosts: Sequence[HostFacts], stripes: Stripes) -> list[list[str]]:
    """validate_nccl's node checks over every host: THP, MPS, GPU clock slowdowns, the checkpoint's stripes."""
    nodes = {h.host: h.node for h in hosts}
    why_no_gpu = next(iter(nodes.values())).gpu_why or "no GPU"
    return [
        per_host("transparent huge pages off", {h: n.thp for h, n in nodes.items()}, lambda v: v == "never"),
        per_host("no MPS daemon (one process per GPU)", {h: n.mps_daemon for h, n in nodes.items()}, lambda v: not v),
        per_host(
            "no GPU clock slowdown (NVML: thermal, power brake)",
            {h: n.gpu_slowdowns for h, n in nodes.items()},
            lambda v: not any(v),
            why_unknown=why_no_gpu,
        ),
        [
            "checkpoint folder's Lustre stripe count",
            "-" if stripes.count is None else str(stripes.count),
            stripes.source if stripes.count is None else "pass (validate_nccl gates it)",
        ],
    ]


def per_host(
    item: str, values: dict[str, object], good: Callable[[object], bool], *, why_unknown: str = "unreadable here"
) -> list[str]:
    """A checklist row of one fact per host: pass, FAIL naming the hosts, or n/a with the reason."""
    known = {host: v for host, v in values.items() if v is not None}
    if not known:
        return [item, "-", f"n/a ({why_unknown})"]
    bad = sorted(host for host, v in known.items() if not good(v))
    measured = ", ".join(f"{host}: {v}" for host, v in sorted(known.items()))
    return [item, measured, f"FAIL on {', '.join(bad)}" if bad else "pass"]


def profiled(profile: ProfileSummary | None) -> list[str]:
    if not profile:
        return ["PyTorch profiler trace analysed", "-", "off (observe.profile=false)"]
    top = profile.top[0]
    return ["PyTorch profiler trace analysed", f"top operator {top.name} ({top.share:.0%} of self time)", "pass"]


def leak_check(segments: Sequence[SegmentSummary], leak_mb: float) -> list[str]:
    """Rank 0's memory growth from each segment's second step to its last (the first allocates for good)."""
    growth = [s.steps[-1].memory_mb - s.steps[1].memory_mb for s in segments if len(s.steps) > 2]
    item = f"no memory leak (growth <= observe.leak_mb = {leak_mb:g} MB per segment)"
    if not growth:
        return [item, "-", "n/a (segments of 2 steps or fewer)"]
    worst = max(growth)
    remedy = "FAIL: find the kernel with CUDA_LAUNCH_BLOCKING=1, read torch.cuda.memory_summary()"
    return [item, f"{worst:+.1f} MB", "pass" if worst <= leak_mb else remedy]
