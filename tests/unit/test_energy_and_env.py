"""Energy accounting (the seed's figures) and the NCCL environment audit."""

from __future__ import annotations

import math

from tests.support import job_metrics
from trainflow.config import EnergyConfig
from trainflow.energy.accounting import campaign_gwh, facility, stage_energy
from trainflow.gate.env import audit_env
from trainflow.gate.patterns import bus_factor


def test_seed_campaign_energy():
    # 4096 GPUs x 560 W x 2160 h ~= 4.95 GWh; PUE 1.05 on top.
    assert math.isclose(campaign_gwh(gpus=4096, watts=560, hours=2160), 4.954, rel_tol=1e-3)
    assert math.isclose(campaign_gwh(gpus=4096, watts=560, hours=2160, pue=1.05), 5.202, rel_tol=1e-3)


def test_stage_energy_prefers_counters_and_states_the_model():
    energy = EnergyConfig(cpu_watts_per_core=10, gpu_watts=500)
    modelled = stage_energy(job_metrics(wall_s=2.0, cpu_s=3.0), energy=energy, gpus=4)
    assert modelled.cpu_j == 30 and modelled.gpu_j == 4000
    assert modelled.cpu_source.startswith("model") and modelled.gpu_source.startswith("model")
    measured = stage_energy(job_metrics(wall_s=2.0, cpu_s=3.0, rapl_j=7.0, gpu_j=11.0), energy=energy, gpus=4)
    assert (measured.cpu_j, measured.gpu_j, measured.cpu_source, measured.gpu_source) == (7.0, 11.0, "rapl", "nvml")
    total = facility(3.6e6, EnergyConfig(pue=1.05, grid_gco2_per_kwh=30))
    assert math.isclose(total.facility_kwh, 1.05) and math.isclose(total.co2_g, 31.5)


def test_bus_bandwidth_factor_is_nccl_tests_all_reduce():
    assert bus_factor("all_reduce", 2) == 1.0 and bus_factor("all_reduce", 8) == 1.75


def test_audit_maps_the_seeds_names_and_flags_unknown_ones():
    warnings = audit_env(
        {
            "NCCL_TIMEOUT": "300",
            "NCCL_NSOCKS_P2P_NIC": "4",
            "NCCL_GRAPH": "x",
            "NCCL_ALOG": "Tree",
            "NCCL_ALGO": "Tree",
            "NCCL_NSOCKS_PERTHREAD": "4",
            "PATH": "/bin",
        }
    )
    text = " | ".join(warnings)
    assert len(warnings) == 4
    assert "NCCL_TIMEOUT" in text and "collective_timeout_s" in text
    assert "NCCL_NSOCKS_PERTHREAD x NCCL_SOCKET_NTHREADS" in text
    assert "NCCL_GRAPH_FILE" in text
    assert "NCCL_ALOG is not a documented NCCL variable" in text
