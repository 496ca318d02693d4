"""The gate's calibration of the plan (trainflow.gate.calibrate) on made-up measurements: the links from the patterns
and the sweep, the block rate from the probe's seconds, and a recorded plan whose block time is the probe's."""

from __future__ import annotations

import pytest

from trainflow.config import compose
from trainflow.config.shape import block_flops_per_token, output_params
from trainflow.gate.calibrate import Probe, calibrate, link_values, with_hardware
from trainflow.gate.report import PatternRow, SweepRow
from trainflow.plan.setup import plan_setup
from trainflow.plan.step import plan_step


def pattern(name: str, busbw: float, hosts: list[str], size: int = 2) -> PatternRow:
    return PatternRow(name, 1, size, 1 << 24, list(range(size)), hosts, 0.01, busbw, None, None)


def ring(nbytes: int, n: int, gbps: float, latency_us: float) -> SweepRow:
    """A sweep row of an all_reduce that follows the alpha-beta ring model exactly."""
    factor = 2 * (n - 1) / n
    seconds = 2 * (n - 1) * latency_us * 1e-6 + factor * nbytes / (gbps * 1e9)
    return SweepRow(nbytes, seconds, nbytes / seconds / 1e9, nbytes / seconds / 1e9 * factor)


def test_links_come_from_the_slowest_patterns_and_the_latency_from_the_sweep():
    sweep = [ring(1 << 18, 2, 0.8, 400.0), ring(1 << 24, 2, 0.8, 400.0)]
    inside = [pattern("dp_all_reduce", 0.7, ["a"]), pattern("tp_all_reduce", 0.9, ["a"])]
    values = link_values(inside, sweep, ["a", "a"])
    assert values["intra_node_gbps"] == 0.7 and "inter_node_gbps" not in values
    assert values["intra_node_latency_us"] == pytest.approx(400.0)
    across = link_values([pattern("dp_all_reduce", 50.0, ["a", "b"], size=8)], [], ["a"] * 4 + ["b"] * 4)
    assert across == {"inter_node_gbps": 12.5}  # 4 members per node share the nodes' NICs
    assert link_values([], sweep, ["a", "a"])["intra_node_gbps"] == pytest.approx(sweep[-1].busbw_gbps)


def probes(cfg, flops_per_s: float, *, ends_s: float = 0.0, cores: int = 2) -> list[Probe]:
    """What every rank's probe would measure at a rate of flops_per_s (no tp: nothing to subtract), plus ends_s."""
    m, p = cfg.model, cfg.parallel
    tokens, blocks = plan_setup(cfg).microbatch_size * m.seq_len, m.n_layers // p.pp
    stages = [r // (p.world_size // p.pp) for r in range(p.world_size)]  # the mesh is (pp, dp, tp), row-major
    flops = [
        blocks * tokens * 3 * sum(block_flops_per_token(m)) + (s == p.pp - 1) * tokens * 6 * output_params(m)
        for s in stages
    ]
    return [Probe(f / flops_per_s + ends_s, blocks, s, cores) for f, s in zip(flops, stages)]


def test_the_compute_rate_becomes_the_plans_and_its_stage_takes_the_probe_s_time():
    cfg = compose("train_segment", [])  # tiny, dp2: 0.1 TFLOP/s x 0.6 configured
    measured = probes(cfg, 20e9, ends_s=0.01)  # the lookups, loss and autograd around the matmuls take 10 ms more
    values, cal = calibrate(cfg, probes=measured, patterns=[], sweep=[], hosts=["a", "a"])
    calibrated = with_hardware(cfg, **values)
    planned = plan_step(calibrated, plan_setup(calibrated))
    assert planned.split.compute == pytest.approx(cfg.parallel.microbatches * measured[0].stage_s)
    by_name = {c.name: c for c in cal.constants}
    assert by_name["matmul_efficiency"].configured == 0.6
    assert by_name["matmul_efficiency"].measured < 0.2  # below the matmuls' 20 GFLOP/s: the rest is slower
    assert cal.configured_step_s == pytest.approx(plan_step(cfg, plan_setup(cfg)).step_s)


def test_a_rate_above_the_configured_peak_raises_it_and_oversubscribed_cpus_leave_out_the_bubble():
    cfg = compose("train_segment", [])
    values, _ = calibrate(cfg, probes=probes(cfg, 2e11), patterns=[], sweep=[], hosts=["a", "a"])
    assert values["matmul_efficiency"] == 1.0 and values["peak_tflops"] == pytest.approx(0.2)
    pp = compose("train_segment", ["parallel=pp2_1f1b"])
    bubble = plan_step(pp, plan_setup(pp)).bubble_fraction
    busy, _ = calibrate(pp, probes=probes(pp, 10e9), patterns=[], sweep=[], hosts=["a", "a"])
    shared, cal = calibrate(pp, probes=probes(pp, 10e9, cores=1), patterns=[], sweep=[], hosts=["a", "a"])
    assert shared["matmul_efficiency"] == pytest.approx(busy["matmul_efficiency"] / (1 - bubble))
    assert "bubble-corrected" in cal.constants[-1].source
