"""The DVFS policy on a recorded trace, Slurm's ConsumedEnergy through a fake `sacct`, the seed's estimate,
and the energy settings refused before anything runs."""

from __future__ import annotations

import itertools
import math
import stat
from pathlib import Path

import pytest

from tests.support import marks
from trainflow.config import EnergyConfig, compose
from trainflow.energy import control
from trainflow.energy.accounting import dvfs_outcome
from trainflow.energy.control import GpuControls
from trainflow.energy.dvfs import IDLE_CLOCK_POWER_SHARE, Phase, dvfs_clocks, lowered_s, phase_trace
from trainflow.energy.estimate import estimate, main
from trainflow.energy.slurm import consumed_energy
from trainflow.errors import ConfigError, TrainflowError

# Segment 0 of a smoke run on the 2-core dev VM (dp2, CPU): rank 0's step records and checkpoint saves.
RECORDED_STEPS = marks(
    {"step": 0, "data_s": 0.001065, "step_s": 0.310547},
    {"step": 1, "data_s": 0.001050, "step_s": 0.201638},
    {"step": 2, "data_s": 0.001501, "step_s": 0.098854},
    {"step": 3, "data_s": 0.001031, "step_s": 0.135809},
    {"step": 4, "data_s": 0.001078, "step_s": 0.126566},
    {"step": 5, "data_s": 0.001326, "step_s": 0.121810},
)
RECORDED_SAVES = marks({"step": 3, "save_s": 0.140263}, {"step": 6, "save_s": 0.222018})


def test_policy_on_a_recorded_trace_lowers_data_phases_after_a_long_enough_one():
    trace = phase_trace(RECORDED_STEPS, RECORDED_SAVES)
    assert [p.kind for p in trace[:7]] == ["data", "compute", "data", "compute", "data", "compute", "checkpoint"]
    assert trace[1].seconds == pytest.approx(0.310547 - 0.001065)
    clocks = dvfs_clocks(trace, idle_mhz=500, compute_mhz=1980, min_phase_s=0.00105)
    data_clocks = [mhz for p, mhz in zip(trace, clocks) if p.kind == "data"]
    # data phase k is lowered when phase k-1 lasted >= 1.05 ms: 1.065 yes, 1.050 yes, 1.501 yes, 1.031 no, 1.078 yes
    assert data_clocks == [1980, 500, 500, 500, 1980, 500]
    assert all(mhz == 1980 for p, mhz in zip(trace, clocks) if p.kind != "data")
    assert lowered_s(trace, clocks, compute_mhz=1980) == pytest.approx(0.001050 + 0.001501 + 0.001031 + 0.001326)
    # at the default 10 ms no phase of this CPU run qualifies: the policy does nothing
    assert set(dvfs_clocks(trace, idle_mhz=500, compute_mhz=1980, min_phase_s=0.01)) == {1980}


def test_saving_estimate_is_lowered_seconds_times_gpus_times_the_power_shed():
    energy = EnergyConfig(pue=1.05, grid_gco2_per_kwh=30, dvfs=True, gpu_watts=560, dvfs_min_phase_s=0.00105)
    segment = (RECORDED_STEPS, RECORDED_SAVES)
    out = dvfs_outcome([segment], energy=energy, gpus=8, applied=False, basis="test")
    assert out.lowered_phases == 4
    assert out.estimated_saving_j == pytest.approx(0.004908 * 8 * 560 * (1 - IDLE_CLOCK_POWER_SHARE))
    off = EnergyConfig(pue=1.05, grid_gco2_per_kwh=30, dvfs=False, dvfs_min_phase_s=0.00105)
    assert dvfs_outcome([segment], energy=off, gpus=8, applied=False, basis="test").estimated_saving_j == 0


def test_live_controller_does_what_the_policy_does_on_the_same_trace(monkeypatch, tmp_path):
    kinds = ("data", "compute") * 3 + ("data",)
    trace = [Phase(k, s) for k, s in zip(kinds, (0.02, 1.0, 0.005, 1.0, 0.03, 1.0, 0.02))]
    ticks = itertools.accumulate([0.0, *(p.seconds for p in trace)])
    monkeypatch.setattr(control.time, "perf_counter", lambda: next(ticks))
    energy = EnergyConfig(pue=1.05, grid_gco2_per_kwh=30, dvfs=True, dvfs_min_phase_s=0.01)
    live = GpuControls(None, "no GPU here", energy=energy, state_file=tmp_path / "state.json")
    for phase in trace:
        live.enter(phase.kind)
    clocks = dvfs_clocks(trace, idle_mhz=500, compute_mhz=1980, min_phase_s=0.01)
    assert clocks == [1980, 1980, 500, 1980, 1980, 1980, 500]
    assert live.lowered == 2 == sum(mhz == 500 for mhz in clocks)
    assert live.actions == ["would have locked clocks at 500 MHz while data loads; not applied: no GPU here"]


def fake_sacct(monkeypatch, tmp_path: Path, output: str, status: int = 0) -> None:
    """A `sacct` first on PATH that prints `output` and exits with `status`."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    script = bin_dir / "sacct"
    (tmp_path / "out.txt").write_text(output)
    script.write_text(f"#!/bin/sh\ncat '{tmp_path}/out.txt' >&{2 if status else 1}\nexit {status}\n")
    script.chmod(script.stat().st_mode | stat.S_IEXEC)
    monkeypatch.setenv("PATH", f"{bin_dir}:/usr/bin:/bin")


def test_sacct_consumed_energy_is_read_for_the_job(monkeypatch, tmp_path):
    fake_sacct(monkeypatch, tmp_path, "12|52000|35|billing=8,cpu=8,gres/gpu=8,node=2\n12.batch|26000|35|cpu=4\n")
    out = consumed_energy("12")
    assert (out["consumed_j"], out["elapsed_s"], out["status"]) == (52000.0, 35.0, "measured")
    assert out["alloc_tres"] == "billing=8,cpu=8,gres/gpu=8,node=2"


def test_sacct_without_an_energy_plugin_says_not_configured(monkeypatch, tmp_path):
    fake_sacct(monkeypatch, tmp_path, "12|0|35|billing=2,cpu=2,mem=1000M,node=1\n")
    out = consumed_energy("12")
    assert out["consumed_j"] is None and out["status"].startswith("not configured")


def test_sacct_without_slurmdbd_says_not_available(monkeypatch, tmp_path):
    fake_sacct(monkeypatch, tmp_path, "sacct: error: Problem talking to the database: Connection refused\n", 1)
    out = consumed_energy("12")
    assert out["status"] == (
        "not available: sacct failed (sacct: error: Problem talking to the database: Connection refused); "
        "accounting needs slurmdbd"
    )
    assert consumed_energy(None)["status"] == "not a Slurm job (local executor)"
    with pytest.raises(TrainflowError, match=r"slurm job id '12; rm -rf x' is not a Slurm job id"):
        consumed_energy("12; rm -rf x")


def test_the_seeds_estimate():
    e = estimate(gpus=4096, hours=2160, energy=EnergyConfig(pue=1.05, grid_gco2_per_kwh=30), dvfs_saving=0.08)
    assert e["it_gwh"] == pytest.approx(4096 * 560 * 2160 / 1e9) and round(e["it_gwh"], 2) == 4.95
    assert e["facility_gwh"] == pytest.approx(4.9545216 * 1.05)
    assert [round(r["tokens_per_joule"], 3) for r in e["table"]] == [1.115, 1.161, 1.364]
    assert e["dvfs_saved_gwh"] == pytest.approx(4.9545216 * 1.05 * 0.08)
    assert e["co2_t"] == pytest.approx(4.9545216 * 1.05 * 0.92 * 30)  # 1 GWh at 1 g/kWh = 1 t
    assert math.isclose(e["dvfs_data_share"] * (1 - IDLE_CLOCK_POWER_SHARE), 0.08)


def test_the_estimate_command_prints_the_seeds_figures(capsys):
    assert main([]) == 0
    out = capsys.readouterr().out
    assert "4096 GPUs x 560 W x 2160 h = 4.95 GWh IT (before PUE)" in out
    assert "x PUE 1.05 = 5.20 GWh" in out
    assert "1.115 tokens/J" in out and "1.161 tokens/J" in out and "1.364 tokens/J" in out
    assert main(["--gpus", "0"]) == 1 and capsys.readouterr().err.strip() == (
        "trainflow.energy.estimate: --gpus(0) must be >= 1"
    )


@pytest.mark.parametrize(
    ("override", "line"),
    [
        ("energy.pue=0.9", "energy.pue(0.9) must be >= 1"),
        ("energy.gpu_watts=-5", "energy.gpu_watts(-5.0) must be >= 0"),
        ("energy.cpu_watts_per_core=-1", "energy.cpu_watts_per_core(-1.0) must be >= 0"),
        ("energy.power_cap_w=-660", "energy.power_cap_w(-660.0) must be >= 0"),
        ("energy.sample_period_s=0", "energy.sample_period_s(0.0) must be > 0"),
        (
            "energy.idle_clock_mhz=2500",
            "energy.idle_clock_mhz(2500) > energy.compute_clock_mhz(1980): DVFS lowers clocks while data loads; "
            "choose an idle clock in 1-1980 MHz",
        ),
    ],
)
def test_bad_energy_settings_are_one_line_before_anything_runs(override, line):
    with pytest.raises(ConfigError) as err:
        compose("account_energy", [override])
    assert str(err.value) == f"invalid config: {line}"
