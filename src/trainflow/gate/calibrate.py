"""The gate calibrates the plan on the allocation it was given: the devices' block rate and the links' bandwidths
and latency, measured where training will run, become the recorded plan's constants; the configured ones stay beside
them with their ratio.

    seconds = block_seconds(cfg, mesh, device)                 # on every rank, all at once, inside the gate's job
    values, calibration = calibrate(cfg, seconds=..., ...)     # on the stage, from every rank's results

- Block rate: one trainflow Block's forward and backward on one microbatch at the layout's shapes (train.global_batch
  / (dp x microbatches) sequences of seq_len tokens), split over the tp group as training splits it (TP_PLAN), in the
  run's precision and with its threads per rank, every rank at once, so ranks sharing a node's cores or its memory
  share them as in training. Its model FLOPs per rank over its median time less the plan's tp all-reduces of one
  block (the plan counts those apart) is what the plan's peak_tflops x matmul_efficiency stands for: a real block's
  matmuls with its norms, rotary embeddings, softmax and SwiGLU around them (benchmarks/plan_vs_measured.py's block
  probe; on this 2-core VM it gave the plan 0.96-1.02x of measured steps where configured constants gave ~0.35-0.5x).
  The slowest rank's rate sets matmul_efficiency (peak_tflops is raised only where a rate exceeds it). On CPU ranks
  that outnumber the node's cores, pipeline ranks idle through their bubble and leave the cores to the others, which
  the probe (every rank busy) does not: the rate is divided by 1 - the bubble share there.
- Links: each pattern's slowest group's bus bandwidth is its link's (nccl-tests' busbw is the bottleneck link's
  bandwidth for the ring), intra_node_gbps from groups inside one node, inter_node_gbps from groups across nodes
  (divided by the group's members per node, as plan.collectives counts NICs); where the layout has no such pattern the
  world sweep's largest message stands for it. The latency of one hop from the sweep's smallest and largest messages
  (t = 2 (n-1) alpha + 2 (n-1)/n S / B), for the kind of link the world spans.
"""

from __future__ import annotations

import contextlib
from dataclasses import replace

import torch
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.tensor.parallel import parallelize_module

from trainflow.config.schema import PRECISIONS, TrainflowConfig
from trainflow.config.shape import block_flops_per_token
from trainflow.gate.report import Calibration, Constant, PatternRow, SweepRow
from trainflow.model import Block, rope_tables
from trainflow.parallel.tensor_parallel import TP_PLAN
from trainflow.parallel.timing import median_seconds
from trainflow.plan.memory import checked_layout
from trainflow.plan.step import plan_step

PROBE_ITERS = 7


def block_seconds(cfg: TrainflowConfig, mesh: DeviceMesh | None, device: torch.device) -> float:
    """This rank's median seconds of one block's forward and backward at the layout's microbatch (module docstring)."""
    m, t = cfg.model, cfg.train
    rows = checked_layout(cfg)[1]
    threads = torch.get_num_threads()
    torch.set_num_threads(t.threads_per_rank)
    try:
        torch.manual_seed(0)
        block = Block(m).to(device)
        if cfg.parallel.tp > 1:
            parallelize_module(block, mesh["tp"], TP_PLAN)
        cos, sin = (r.to(device) for r in rope_tables(m.head_dim, m.seq_len, m.rope_theta))
        x = torch.randn(rows, m.seq_len, m.dim, device=device, requires_grad=True)
        dtype = getattr(torch, PRECISIONS[t.precision].dtype)
        autocast = torch.autocast(device.type, dtype=dtype) if dtype != torch.float32 else contextlib.nullcontext()

        def run() -> None:
            with autocast:
                out = block(x, cos, sin)
            out.float().sum().backward()

        group = torch.distributed.group.WORLD
        return median_seconds(run, group=group, iters=PROBE_ITERS, device=device, warmup=2)
    finally:
        torch.set_num_threads(threads)


def link_values(patterns: list[PatternRow], sweep: list[SweepRow], hosts: list[str]) -> dict:
    """The measured intra_node_gbps / inter_node_gbps and the latency of the world's kind of link (module docstring)."""
    found: dict[str, list[float]] = {}
    for row in patterns:
        per_node = row.group_size / len(row.slowest_hosts)
        kind = "inter_node" if len(row.slowest_hosts) > 1 else "intra_node"
        found.setdefault(kind, []).append(row.busbw_gbps / (per_node if kind == "inter_node" else 1))
    world = "inter_node" if len(set(hosts)) > 1 else "intra_node"
    values = {f"{kind}_gbps": min(v) for kind, v in found.items()}
    if sweep and f"{world}_gbps" not in values:
        values[f"{world}_gbps"] = sweep[-1].busbw_gbps / (len(hosts) / len(set(hosts)) if world == "inter_node" else 1)
    if len(sweep) > 1 and (n := len(hosts)) > 1:
        small, large = sweep[0], sweep[-1]
        factor = 2 * (n - 1) / n
        gbps = factor * (large.bytes - small.bytes) / (large.time_s - small.time_s) / 1e9
        if gbps > 0:
            latency_s = (small.time_s - factor * small.bytes / (gbps * 1e9)) / (2 * (n - 1))
            values[f"{world}_latency_us"] = max(0.0, latency_s * 1e6)
    return values


def calibrate(
    cfg: TrainflowConfig,
    *,
    seconds: list[float],
    patterns: list[PatternRow],
    sweep: list[SweepRow],
    hosts: list[str],
    cores: int,
) -> tuple[dict[str, float], Calibration]:
    """The measured cluster.hardware values and their record: the block probe's seconds of every rank, the judged
    patterns, the world sweep, every rank's host and the cores a rank's node offers."""
    hw, p = cfg.cluster.hardware, cfg.parallel
    links = link_values(patterns, sweep, hosts)
    linked = with_hardware(cfg, **links)
    first = plan_step(linked)
    layers = cfg.model.n_layers // p.pp
    tp_block_s = first.per_pp_rank[0].tp / (layers * p.microbatches)  # one block, one microbatch
    flops = checked_layout(cfg)[1] * cfg.model.seq_len * 3 * sum(block_flops_per_token(cfg.model, tp=p.tp))
    slowest = max(seconds)
    rate = flops / max(slowest - tp_block_s, slowest * 0.1)  # the tp all-reduces never take the whole block
    ranks_per_node = max(1, len(hosts) // len(set(hosts)))
    oversubscribed = cfg.cluster.runtime.device == "cpu" and ranks_per_node * cfg.train.threads_per_rank > cores
    if oversubscribed:
        rate /= 1 - first.bubble_fraction
    efficiency = rate / (hw.peak_tflops * 1e12)
    values = {**links, "matmul_efficiency": min(1.0, efficiency)}
    if efficiency > 1:
        values["peak_tflops"] = rate / 1e12
    probe = (
        f"block probe: one block's forward and backward, {checked_layout(cfg)[1]} x {cfg.model.seq_len} tokens at "
        f"tp{p.tp}, {cfg.train.precision}, slowest of {len(seconds)} ranks ({slowest * 1e3:.2f} ms, median of "
        f"{PROBE_ITERS})" + (", bubble-corrected" if oversubscribed else "")
    )
    sources = {
        "matmul_efficiency": probe,
        "peak_tflops": probe + ": above the configured peak",
        "intra_node_gbps": "slowest group's busbw of the patterns inside a node (else the world sweep's)",
        "inter_node_gbps": "slowest group's busbw across nodes per member of a node (else the world sweep's)",
        "intra_node_latency_us": "world all_reduce sweep, smallest and largest message",
        "inter_node_latency_us": "world all_reduce sweep, smallest and largest message",
    }
    constants = [Constant(k, float(getattr(hw, k)), float(v), sources[k]) for k, v in values.items()]
    return values, Calibration(constants, configured_step_s=plan_step(cfg).step_s)


def with_hardware(cfg: TrainflowConfig, **values: float) -> TrainflowConfig:
    """cfg with the given cluster.hardware values replaced."""
    return replace(cfg, cluster=replace(cfg.cluster, hardware=replace(cfg.cluster.hardware, **values)))
