"""The gate calibrates the plan on the allocation it was given: the devices' block rate and the links' bandwidths
and latency, measured where training will run, become the recorded plan's constants; the configured ones stay beside
them with their ratio.

    probe = probe_compute(cfg, mesh, device)                  # on every rank, all at once, inside the gate's job
    values, calibration = calibrate(cfg, probes=..., ...)     # on the stage, from every rank's results

- Block rate: one trainflow Block's forward and backward on one microbatch at the layout's shapes (train.global_batch
  / (dp x microbatches) sequences of seq_len tokens), split over the tp group as training splits it (TP_PLAN), in the
  run's precision and with its threads per rank, every rank at once, so ranks sharing a node's cores or its memory
  share them as in training; beside it, the ends of the rank's pipeline stage the same way: the embedding on the
  first stage, the final norm, output head and cross-entropy on the last. A rank's model FLOPs of its stage (its
  blocks and, on the last, the head) over the time of its blocks (the probe's, less the plan's tp all-reduces of one
  block, which the plan counts apart) and its ends is what the plan's peak_tflops x matmul_efficiency stands for: real
  matmuls with their norms, rotary embeddings, softmax, SwiGLU, lookups and loss around them (benchmarks/
  plan_vs_measured.py calibrates on the block alone and gets 0.96-1.02x on a model 4x the tiny one's width; on the
  tiny default the ends take about a block's time, and the configured constants planned 0.35-0.5x).
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
import os
from dataclasses import dataclass, replace

import torch
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.tensor.parallel import parallelize_module

from trainflow.config.schema import PRECISIONS, ModelConfig, TrainflowConfig
from trainflow.config.shape import block_flops_per_token, output_params
from trainflow.gate.report import Calibration, Constant, PatternRow, SweepRow
from trainflow.model import Block, Llama, cross_entropy, rope_tables
from trainflow.parallel.tensor_parallel import TP_PLAN
from trainflow.parallel.timing import median_seconds
from trainflow.plan.memory import checked_layout
from trainflow.plan.step import plan_step

PROBE_ITERS = 7


@dataclass(frozen=True)
class Probe:
    """What one rank's devices measured (module docstring)."""

    block_s: float
    """Median seconds of one block's forward and backward on one microbatch."""
    ends_s: float
    """The same of its stage's ends: the embedding (first stage), the norm, head and loss (last stage)."""
    pp_rank: int
    cores: int
    """CPU cores this rank may run on (its affinity)."""


def probe_compute(cfg: TrainflowConfig, mesh: DeviceMesh | None, device: torch.device) -> Probe:
    """This rank's block and stage-end times at the layout's microbatch, in the run's precision and threads."""
    m, t, p = cfg.model, cfg.train, cfg.parallel
    rows = checked_layout(cfg)[1]
    pp_rank = mesh["pp"].get_local_rank() if p.pp > 1 else 0
    threads = torch.get_num_threads()
    torch.set_num_threads(t.threads_per_rank)
    dtype = getattr(torch, PRECISIONS[t.precision].dtype)
    autocast = torch.autocast(device.type, dtype=dtype) if dtype != torch.float32 else contextlib.nullcontext()
    try:
        torch.manual_seed(0)
        with torch.device(device):  # built where it runs: a 70B stage's head is GBs
            block = Block(m)
        if p.tp > 1:
            parallelize_module(block, mesh["tp"], TP_PLAN)
        cos, sin = (r.to(device) for r in rope_tables(m.head_dim, m.seq_len, m.rope_theta))
        x = torch.randn(rows, m.seq_len, m.dim, device=device, requires_grad=True)

        def run_block() -> None:
            with autocast:
                out = block(x, cos, sin)
            out.float().sum().backward()

        last = pp_rank == p.pp - 1
        ends, inputs, targets = stage_ends(m, first=pp_rank == 0, last=last, rows=rows, device=device)

        def run_ends() -> None:
            with autocast:
                out = ends(inputs)
                loss = cross_entropy(out, targets) if last else out.float().sum()
            loss.backward()

        group, n = torch.distributed.group.WORLD, PROBE_ITERS
        block_s = median_seconds(run_block, group=group, iters=n, device=device, warmup=2)
        ends_s = median_seconds(run_ends, group=group, iters=n, device=device, warmup=2)
    finally:
        torch.set_num_threads(threads)
    return Probe(block_s, ends_s, pp_rank, len(os.sched_getaffinity(0)))


def stage_ends(m: ModelConfig, *, first: bool, last: bool, rows: int, device: torch.device) -> tuple:
    """A Llama of no blocks holding the ends of a stage (embedding if first, norm and head if last), its input and
    the targets."""
    with torch.device(device):
        ends = Llama(replace(m, n_layers=0))
    if not first:
        ends.tok_embeddings = None
    if not last:
        ends.norm = ends.output = None
    ids = torch.randint(0, m.vocab_size, (rows, m.seq_len), device=device)
    x = ids if first else torch.randn(rows, m.seq_len, m.dim, device=device, requires_grad=True)
    return ends, x, ids


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
    cfg: TrainflowConfig, *, probes: list[Probe], patterns: list[PatternRow], sweep: list[SweepRow], hosts: list[str]
) -> tuple[dict[str, float], Calibration]:
    """The measured cluster.hardware values and their record, from every rank's probe, the judged patterns, the world
    sweep and every rank's host."""
    hw, p = cfg.cluster.hardware, cfg.parallel
    links = link_values(patterns, sweep, hosts)
    first = plan_step(with_hardware(cfg, **links))
    rate, slowest = compute_rate(cfg, probes, tp_block_s=first.per_pp_rank[0].tp / (stage_layers(cfg) * p.microbatches))
    ranks_per_node = max(1, len(hosts) // len(set(hosts)))
    cores = min(probe.cores for probe in probes)
    oversubscribed = cfg.cluster.runtime.device == "cpu" and ranks_per_node * cfg.train.threads_per_rank > cores
    if oversubscribed:
        rate /= 1 - first.bubble_fraction
    efficiency = rate / (hw.peak_tflops * 1e12)
    values = {**links, "matmul_efficiency": min(1.0, efficiency)}
    if efficiency > 1:
        values["peak_tflops"] = rate / 1e12
    probe = (
        f"compute probe: a block's and the stage ends' forward and backward, {checked_layout(cfg)[1]} x "
        f"{cfg.model.seq_len} tokens at tp{p.tp}, {cfg.train.precision}; slowest of {len(probes)} ranks (pipeline "
        f"rank {slowest.pp_rank}: block {slowest.block_s * 1e3:.2f} ms, ends {slowest.ends_s * 1e3:.2f} ms, medians "
        f"of {PROBE_ITERS})" + (", bubble-corrected" if oversubscribed else "")
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


def stage_layers(cfg: TrainflowConfig) -> int:
    return cfg.model.n_layers // cfg.parallel.pp


def compute_rate(cfg: TrainflowConfig, probes: list[Probe], *, tp_block_s: float) -> tuple[float, Probe]:
    """The slowest rank's model FLOP/s over its stage (its blocks, and the head on the last stage) and that rank."""
    m, p = cfg.model, cfg.parallel
    tokens = checked_layout(cfg)[1] * m.seq_len
    block_flops = tokens * 3 * sum(block_flops_per_token(m, tp=p.tp))

    def rate(probe: Probe) -> float:
        flops = stage_layers(cfg) * block_flops + (probe.pp_rank == p.pp - 1) * tokens * 3 * 2 * output_params(m)
        block_s = max(probe.block_s - tp_block_s, probe.block_s * 0.1)  # tp's all-reduces never take the whole block
        return flops / (stage_layers(cfg) * block_s + probe.ends_s)

    slowest = min(probes, key=rate)
    return rate(slowest), slowest


def with_hardware(cfg: TrainflowConfig, **values: float) -> TrainflowConfig:
    """cfg with the given cluster.hardware values replaced."""
    return replace(cfg, cluster=replace(cfg.cluster, hardware=replace(cfg.cluster.hardware, **values)))
