"""The gate calibrates the plan on the allocation it was given: the devices' compute rate and the links' bandwidths
and latency, measured where training will run, become the recorded plan's constants; the configured ones stay beside
them with their ratio.

    probe = probe_compute(cfg, mesh, device)                  # on every rank, all at once, inside the gate's job
    values, calibration = calibrate(cfg, probes=..., ...)     # on the stage, from every rank's results

- Compute rate: the rank's own pipeline stage, at most PROBE_BLOCKS of its blocks (a Llama of that many blocks with
  the stage's ends: the embedding on the first stage, the final norm, output head and cross-entropy on the last),
  split over the tp group as training splits it (apply_tp), forward and backward on one microbatch at the layout's
  shapes (train.global_batch / (dp x microbatches) sequences of seq_len tokens), in the run's precision and threads
  per rank, every rank at once, so ranks sharing a node's cores or its memory share them as in training. Its model
  FLOPs (the blocks and, on the last stage, the head) over its median time (at least PROBE_ITERS calls over
  PROBE_SPAN_S: a shared machine's speed drifts within seconds) less the plan's tp all-reduces of those
  blocks (the plan counts them apart) is what the plan's peak_tflops x matmul_efficiency stands for: real matmuls
  with the norms, rotary embeddings, softmax, SwiGLU, lookups, loss and autograd around them. A stage longer than
  PROBE_BLOCKS is planned at its first blocks' rate. The stage is probed whole, not a bare block, because the chain of
  blocks and the model around them cost more than the blocks one by one (benchmarks/plan_vs_measured.py measures
  both). The slowest rank's rate sets matmul_efficiency (peak_tflops is raised only where a rate exceeds it). On CPU
  ranks that outnumber the node's cores, pipeline ranks idle through their bubble and leave the cores to the others,
  which the probe (every rank busy) does not: the rate is divided by 1 - the bubble share there.
- Links: each pattern's slowest group's bus bandwidth is its link's (nccl-tests' busbw is the bottleneck link's
  bandwidth for the ring), intra_node_gbps from groups inside one node, inter_node_gbps from groups across nodes
  (divided by the group's members per node, as plan.collectives counts NICs); where the layout has no such pattern the
  world sweep's largest message stands for it. The latency of one hop from the sweep's smallest and largest messages
  (t = 2 (n-1) alpha + 2 (n-1)/n S / B), for the kind of link the world spans.
"""

from __future__ import annotations

import contextlib
import math
import os
from collections.abc import Callable
from dataclasses import dataclass, replace

import torch
from torch.distributed.device_mesh import DeviceMesh

from trainflow.config.schema import PRECISIONS, TrainflowConfig
from trainflow.gate.report import Calibration, Constant, PatternRow, SweepRow
from trainflow.model import Llama, cross_entropy
from trainflow.parallel.tensor_parallel import apply_tp
from trainflow.parallel.timing import median_seconds
from trainflow.plan.measured_hardware import with_hardware
from trainflow.plan.setup import PlanSetup, plan_setup
from trainflow.plan.step import plan_step

PROBE_BLOCKS, PROBE_ITERS, PROBE_MAX_ITERS, PROBE_SPAN_S = 4, 9, 200, 4.0
"""The compute probe's stage holds at most PROBE_BLOCKS of the rank's blocks; it is timed PROBE_ITERS times at least,
over PROBE_SPAN_S seconds where that takes more (at most PROBE_MAX_ITERS), and its median taken."""


@dataclass(frozen=True)
class Probe:
    """What one rank's devices measured (module docstring)."""

    stage_s: float
    """Median seconds of one microbatch's forward and backward through the rank's stage cut to `blocks` blocks."""
    blocks: int
    pp_rank: int
    cores: int
    """CPU cores this rank may run on (its affinity)."""


def probe_compute(cfg: TrainflowConfig, mesh: DeviceMesh | None, device: torch.device) -> Probe:
    """This rank's stage (at most PROBE_BLOCKS blocks of it) timed at the layout's microbatch, in the run's precision
    and threads, every rank at once (module docstring)."""
    p, t = cfg.parallel, cfg.train
    pp_rank = mesh["pp"].get_local_rank() if p.pp > 1 else 0
    blocks = min(stage_layers(cfg), PROBE_BLOCKS)
    threads = torch.get_num_threads()
    torch.set_num_threads(t.threads_per_rank)
    try:
        rows = plan_setup(cfg).microbatch_size
        run = stage_step(cfg, mesh, device, pp_rank=pp_rank, blocks=blocks, rows=rows)
        group = torch.distributed.group.WORLD
        first = median_seconds(run, group=group, iters=1, device=device, warmup=1)
        # Enough calls to span PROBE_SPAN_S, as many on every rank: a shared machine's speed drifts within seconds.
        calls = max(PROBE_ITERS, min(PROBE_MAX_ITERS, math.ceil(PROBE_SPAN_S / first)))
        iters = torch.tensor(calls, device=device)  # on the device: NCCL reduces only device tensors
        torch.distributed.all_reduce(iters, op=torch.distributed.ReduceOp.MAX)
        seconds = median_seconds(run, group=group, iters=int(iters), device=device, warmup=0)
    finally:
        torch.set_num_threads(threads)
    return Probe(seconds, blocks, pp_rank, len(os.sched_getaffinity(0)))


def stage_step(
    cfg: TrainflowConfig, mesh: DeviceMesh | None, device: torch.device, *, pp_rank: int, blocks: int, rows: int
) -> Callable[[], None]:
    """One microbatch (`rows` sequences) forward and backward through this rank's stage cut to `blocks` blocks: the
    embedding on the first stage, the final norm, output head and cross-entropy on the last, tp as training splits
    it."""
    m, p = cfg.model, cfg.parallel
    first, last = pp_rank == 0, pp_rank == p.pp - 1
    torch.manual_seed(0)
    with torch.device(device):  # built where it runs: a 70B stage's head is GBs
        model = Llama(replace(m, n_layers=blocks))
    if not first:
        model.tok_embeddings = None
    if not last:
        model.norm = model.output = None
    if p.tp > 1:
        apply_tp(model, mesh["tp"])
    ids = torch.randint(0, m.vocab_size, (rows, m.seq_len), device=device)
    inputs = ids if first else torch.randn(rows, m.seq_len, m.dim, device=device, requires_grad=True)
    dtype = getattr(torch, PRECISIONS[cfg.train.precision].dtype)
    autocast = torch.autocast(device.type, dtype=dtype) if dtype != torch.float32 else contextlib.nullcontext()

    def run() -> None:
        with autocast:
            out = model(inputs)
            loss = cross_entropy(out, ids) if last else out.float().sum()
        loss.backward()

    return run


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
    hw, p, setup = cfg.cluster.hardware, cfg.parallel, plan_setup(cfg)
    links = link_values(patterns, sweep, hosts)
    linked = with_hardware(cfg, **links)
    first = plan_step(linked, plan_setup(linked))
    tp_block_s = first.per_pp_rank[0].tp / (stage_layers(cfg) * p.microbatches)
    rate, slowest = compute_rate(cfg, setup, probes, tp_block_s=tp_block_s)
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
        f"compute probe: the stage's forward and backward with {slowest.blocks} of its {stage_layers(cfg)} blocks, "
        f"{setup.microbatch_size} x {cfg.model.seq_len} tokens at tp{p.tp}, {cfg.train.precision}; slowest of "
        f"{len(probes)} ranks (pipeline rank {slowest.pp_rank}: {slowest.stage_s * 1e3:.2f} ms, median over "
        f"{PROBE_SPAN_S:g} s)" + (", bubble-corrected" if oversubscribed else "")
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
    return values, Calibration(constants, configured_step_s=plan_step(cfg, setup).step_s)


def stage_layers(cfg: TrainflowConfig) -> int:
    return cfg.model.n_layers // cfg.parallel.pp


def compute_rate(
    cfg: TrainflowConfig, setup: PlanSetup, probes: list[Probe], *, tp_block_s: float
) -> tuple[float, Probe]:
    """The slowest rank's model FLOP/s over its probed stage (its blocks, and the head on the last stage), its tp
    all-reduces left out, and that rank."""
    p, counts = cfg.parallel, setup.counts
    tokens = setup.microbatch_size * cfg.model.seq_len
    block_flops = tokens * 3 * (counts.block_linear_flops + counts.block_attention_flops)

    def rate(probe: Probe) -> float:
        flops = probe.blocks * block_flops + (probe.pp_rank == p.pp - 1) * tokens * 3 * 2 * counts.output_params
        return flops / max(probe.stage_s - probe.blocks * tp_block_s, probe.stage_s * 0.1)  # tp never takes it all

    slowest = min(probes, key=rate)
    return rate(slowest), slowest
