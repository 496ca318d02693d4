"""One energy window per node: 2 nodes x 4 ranks with faked NVML and RAPL counters count every GPU and CPU
package once; phases integrate the nodes' traces; the power cap and DVFS clocks are applied, refused or
restored as energy.* says."""

from __future__ import annotations

import contextlib
import json
import math
import sys
import types
from pathlib import Path
from types import SimpleNamespace

import pytest

from tests.support import job_metrics, marks
from trainflow.config import EnergyConfig
from trainflow.energy import meter, sampler
from trainflow.energy.accounting import stage_energy
from trainflow.energy.control import GpuControls
from trainflow.energy.node import node_window, sum_nodes
from trainflow.energy.nvml import NodeGpus
from trainflow.energy.phases import mean_gpu_busy_pct, phase_energy, power_series
from trainflow.energy.report import StageEnergy
from trainflow.errors import ConfigError, TrainflowError


class FakeNvml:
    """The few pynvml functions trainflow calls, over counters the test advances."""

    class NVMLError(Exception):
        pass

    def __init__(self, gpus: int, *, refuse: bool = False) -> None:
        self.energy_mj = [1_000_000 * (i + 1) for i in range(gpus)]  # counters since driver load, not zero
        self.limit_mw = [600_000] * gpus
        self.locked: list[int | None] = [None] * gpus
        self.refuse = refuse
        self.calls: list[str] = []

    def advance(self, joules: float) -> None:
        self.energy_mj = [e + joules * 1e3 for e in self.energy_mj]

    def nvmlInit(self) -> None:
        self.calls.append("init")

    def nvmlShutdown(self) -> None:
        self.calls.append("shutdown")

    def nvmlDeviceGetCount(self) -> int:
        return len(self.energy_mj)

    def nvmlDeviceGetHandleByIndex(self, i: int) -> int:
        return i

    def nvmlDeviceGetTotalEnergyConsumption(self, h: int) -> float:
        self.calls.append("energy")
        return self.energy_mj[h]

    def nvmlDeviceGetPowerUsage(self, h: int) -> int:
        return 300_000

    def nvmlDeviceGetUtilizationRates(self, h: int):
        return types.SimpleNamespace(gpu=90 + h, memory=40)  # GPU 0 90 % busy, GPU 1 91 %, ...

    def nvmlDeviceGetPowerManagementLimit(self, h: int) -> int:
        return self.limit_mw[h]

    def nvmlDeviceGetPowerManagementLimitConstraints(self, h: int) -> tuple[int, int]:
        return 100_000, 700_000

    def nvmlDeviceSetPowerManagementLimit(self, h: int, mw: int) -> None:
        if self.refuse:
            raise self.NVMLError("Insufficient Permissions")
        self.limit_mw[h] = mw

    def nvmlDeviceSetGpuLockedClocks(self, h: int, low: int, high: int) -> None:
        if self.refuse:
            raise self.NVMLError("Insufficient Permissions")
        self.locked[h] = low

    def nvmlDeviceResetGpuLockedClocks(self, h: int) -> None:
        self.locked[h] = None


def fake_rapl(root: Path, joules: float) -> None:
    """One CPU package at `joules` (wrapping at 1000 J), with a sub-domain that must not be added."""
    for name, value in (("intel-rapl:0", joules), ("intel-rapl:0:0", joules / 2)):
        (root / name).mkdir(parents=True, exist_ok=True)
        (root / name / "energy_uj").write_text(str(int(value % 1000 * 1e6)))
        (root / name / "max_energy_range_uj").write_text(str(int(1000 * 1e6)))


@pytest.fixture
def node(monkeypatch, tmp_path):
    """Make the process look like node `name`, with 4 fake GPUs and a RAPL package; returns its counters."""

    def become(name: str, *, refuse: bool = False) -> FakeNvml:
        nvml = FakeNvml(4, refuse=refuse)
        monkeypatch.setitem(sys.modules, "pynvml", nvml)
        monkeypatch.setenv("SLURMD_NODENAME", name)
        monkeypatch.setattr(meter, "RAPL_ROOT", tmp_path / name / "powercap")
        monkeypatch.setattr(sampler, "PROC_STAT", tmp_path / "no-proc-stat")
        fake_rapl(meter.RAPL_ROOT, 990.0)
        return nvml

    return become


def energy_config(**settings) -> EnergyConfig:
    """The seed's facility (PUE 1.05, 30 g/kWh), no cap and a 1 s sampler unless `settings` say otherwise."""
    return EnergyConfig(
        **{"pue": 1.05, "grid_gco2_per_kwh": 30, "power_cap_w": 0.0, "sample_period_s": 1.0, **settings}
    )


ENERGY = energy_config(dvfs=False, sample_period_s=60.0)


def test_two_nodes_of_four_ranks_count_each_gpu_and_package_once(node, tmp_path):
    windows = []
    for name in ("n1", "n2"):
        nvml = node(name)
        with contextlib.ExitStack() as ranks:  # the node's 4 ranks run at once
            opened = [
                ranks.enter_context(node_window(ENERGY, local_rank=r, folder=tmp_path / "power", segment=0))
                for r in range(4)
            ]
            nvml.advance(100.0)  # every GPU of the node drew 100 J ...
            fake_rapl(meter.RAPL_ROOT, 990.0 + 50.0)  # ... and the package 50 J, across its counter's wrap
        windows += [w.result() for w in opened]
    readings = [w for w in windows if w is not None]
    assert [w.host for w in readings] == ["n1", "n2"]  # one window per node: its local rank 0's
    total = sum_nodes(readings)
    assert total.gpu_j == pytest.approx(2 * 4 * 100.0)  # 2 nodes x 4 GPUs x 100 J, not x 4 ranks again
    assert total.rapl_j == pytest.approx(2 * 50.0)
    assert total.gpus == 8
    metrics = job_metrics(stage="train_segment", wall_s=10.0, cpu_s=1.0, rank_cpu_s=8.0, nodes=total.to_json())
    row = stage_energy(metrics, energy=ENERGY, gpus=8)
    assert (row.gpu_j, row.gpu_source, row.cpu_source) == (pytest.approx(800.0), "nvml", "rapl")
    with pytest.raises(TrainflowError, match=r"hosts \['n1'\] sent more than one energy window"):
        sum_nodes([readings[0], readings[0]])
    traces = sorted((tmp_path / "power").glob("segment-0-*.jsonl"))
    assert [t.name for t in traces] == ["segment-0-n1.jsonl", "segment-0-n2.jsonl"]  # one sampler per node
    assert mean_gpu_busy_pct(traces) == pytest.approx(91.5)  # NVML's utilisation of GPUs 0-3: 90-93 %


def test_phase_energy_integrates_the_nodes_counters_over_the_trainers_windows(tmp_path):
    trace = tmp_path / "segment-0-n1.jsonl"
    # 100 W of GPU from t=0 to t=10 (cumulative joules), one sampler run
    trace.write_text("".join(json.dumps({"t": t, "since": 0.0, "gpu_j": 100.0 * t}) + "\n" for t in (0.0, 5.0, 10.0)))
    steps = marks(
        {"step": 0, "started": 1.0, "data_s": 0.5, "step_s": 2.0},
        {"step": 1, "started": 3.0, "data_s": 1.0, "step_s": 3.0},
    )
    saves = marks({"step": 2, "started": 6.5, "save_s": 1.5})
    stage = StageEnergy("train_segment", 0, "train_segment", 12.0, 2.0, 24.0, "model: 2 CPU-s", 1000.0, "nvml", 1024.0)
    window = SimpleNamespace(trace=str(trace))
    rows = {r.phase: r for r in phase_energy(steps, saves, [window], stage)}
    assert rows["data"].seconds == pytest.approx(1.5) and rows["data"].gpu_j == pytest.approx(150.0)
    assert rows["compute"].gpu_j == pytest.approx(100.0 * (1.5 + 2.0))
    assert rows["checkpoint"].gpu_j == pytest.approx(150.0)
    assert rows["other"].gpu_j == pytest.approx(1000.0 - 650.0)  # what the counters saw outside the phases
    # the modelled CPU part is split by time: 24 J over 12 s
    assert rows["other"].seconds == pytest.approx(12.0 - 6.5)
    assert rows["compute"].cpu_j == pytest.approx(24.0 * 3.5 / 12.0)
    assert rows["compute"].cpu_source.endswith("split by phase time") and rows["data"].gpu_source == "nvml"
    assert math.isclose(sum(r.it_j for r in rows.values()), 1024.0)


def test_power_cap_outside_the_devices_range_is_one_line_before_training(node, tmp_path):
    node("n1")
    cap = energy_config(dvfs=False, power_cap_w=800.0)
    with pytest.raises(ConfigError) as err:
        with node_window(cap, local_rank=0, folder=tmp_path, segment=0):
            pytest.fail("training started under a power cap the GPU refuses")
    assert str(err.value) == (
        "energy.power_cap_w(800) is outside GPU 0's allowed range 100-700 W (NVML); "
        "choose a cap in that range, or 0 to keep the driver's limit"
    )


def test_cap_and_clocks_are_applied_and_restored_even_when_training_fails(node, tmp_path):
    nvml = node("n1")
    energy = energy_config(dvfs=True, power_cap_w=660.0, dvfs_min_phase_s=0.0)
    with pytest.raises(RuntimeError, match="rank died"):
        with node_window(energy, local_rank=0, folder=tmp_path, segment=0) as window:
            assert nvml.limit_mw == [660_000] * 4
            window.enter("data")
            window.enter("compute")
            window.enter("data")  # the previous data phase lasted >= 0 s: clocks drop
            assert nvml.locked == [500] * 4
            raise RuntimeError("rank died")
    assert nvml.limit_mw == [600_000] * 4 and nvml.locked == [None] * 4
    assert not list(tmp_path.glob("gpu-state-*.json"))


def test_a_killed_jobs_settings_are_restored_at_the_next_start(node, tmp_path):
    nvml = node("n1")
    energy = energy_config(dvfs=False, power_cap_w=660.0)
    state = tmp_path / "gpu-state-n1.json"
    GpuControls(NodeGpus.open()[0], "", energy=energy, state_file=state).start()  # then SIGKILL: no restore
    assert nvml.limit_mw == [660_000] * 4 and state.exists()
    nvml.locked = [500] * 4
    uncapped = energy_config(dvfs=False)
    controls = GpuControls(NodeGpus.open()[0], "", energy=uncapped, state_file=state)
    controls.start()
    assert nvml.limit_mw == [600_000] * 4 and nvml.locked == [None] * 4
    assert controls.actions == ["restored the GPU settings a killed job left (gpu-state-n1.json)"]


def test_a_refusing_driver_is_recorded_once_and_the_policy_still_traced(node, tmp_path):
    node("n1", refuse=True)
    energy = energy_config(dvfs=True, power_cap_w=660.0, dvfs_min_phase_s=0.0)
    with node_window(energy, local_rank=0, folder=tmp_path, segment=0) as window:
        for _ in range(3):
            window.enter("data")
            window.enter("compute")
    result = window.result()
    assert result.actions == [
        "would have capped every GPU at 660 W; not applied: NVML refused (Insufficient Permissions)",
        "would have locked clocks at 500 MHz while data loads; not applied: NVML refused (Insufficient Permissions)",
    ]
    assert result.dvfs_applied is False and result.dvfs_lowered_phases == 2


def test_without_nvml_the_window_says_why(monkeypatch, tmp_path):
    monkeypatch.setitem(sys.modules, "pynvml", None)  # import pynvml raises ImportError
    monkeypatch.setattr(meter, "RAPL_ROOT", tmp_path / "absent")
    energy = energy_config(dvfs=False, power_cap_w=660.0)
    with node_window(energy, local_rank=0, folder=tmp_path, segment=0) as window:
        pass
    result = window.result()
    assert result.gpu_j is None and result.rapl_j is None and result.gpus == 0
    assert result.actions[0].startswith("would have capped every GPU at 660 W; not applied: NVML unavailable")


def test_power_over_time_from_a_trace_with_a_requeued_run(tmp_path):
    trace = tmp_path / "segment-0-n1.jsonl"
    first = [{"t": t, "since": 0.0, "gpu_j": 300.0 * t, "rapl_j": 50.0 * t} for t in (0.0, 1.0, 2.0)]
    requeued = [{"t": t, "since": 10.0, "gpu_j": 200.0 * (t - 10), "rapl_j": 0.0} for t in (10.0, 12.0)]
    trace.write_text("".join(json.dumps(s) + "\n" for s in first + requeued))
    times, watts, source = power_series(trace, cpu_watts_per_core=12.0)
    assert (times, source) == ([1.0, 2.0, 12.0], "nvml + rapl")
    assert watts == pytest.approx([350.0, 350.0, 200.0])  # the counters restart with the requeued job's sampler
    modelled = tmp_path / "segment-0-n2.jsonl"
    modelled.write_text("".join(json.dumps({"t": t, "since": 0.0, "cpu_busy_s": 1.5 * t}) + "\n" for t in (0.0, 2.0)))
    assert power_series(modelled, cpu_watts_per_core=12.0) == ([2.0], [18.0], "model: busy cores x 12 W")
