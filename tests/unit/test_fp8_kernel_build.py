"""How kernels/ is built and chosen, on CPU: load_backend's rules per compute capability and the measured facts
they read from kernels/measured.json, and the sm90 kernel's configuration per GEMM shape (trainflow.fp8.shapes)
(the compiles themselves and their SASS: tests/unit/test_fp8_sass.py).

    .venv/bin/python -m pytest tests/unit/test_fp8_kernel_build.py -q
"""

from __future__ import annotations

import dataclasses
import json

import pytest
import torch

from trainflow.errors import ConfigError
from trainflow.fp8.build import build_extension
from trainflow.fp8.cache import build_key
from trainflow.fp8.dispatch import ShapeDispatch
from trainflow.fp8.kernels import (
    KERNEL_BUILDS,
    backend_reason,
    choose_backend,
    committed,
    kernel_key,
    kernels_folder,
    load_backend,
    nvcc_flags,
)
from trainflow.fp8.measured import GemmSeconds, KernelMeasurement, Measurements, read_measured
from trainflow.fp8.ops import SCHEMA
from trainflow.fp8.shapes import DEFAULT, SCALED_MM, SM90_CONFIGS, KernelConfig, Schedule, ShapeTiming, heuristic
from trainflow.records import RecordError

SM90 = KERNEL_BUILDS[(9, 0)]
KEY = kernel_key(SM90)
H200 = "NVIDIA H200"
WON = ShapeTiming("70b_tp8_wk_wv", [8192, 128, 8192], {"pingpong_s1": 4.3e-5, "scaled_mm": 5.1e-5})
LOST = ShapeTiming("8192^3", [8192, 8192, 8192], {"stream_k_s1": 1.03e-3, "scaled_mm": 0.83e-3})


def record(**change) -> KernelMeasurement:
    """A GPU check's record of today's sm90 build on an H200 that passed: the kernel faster than _scaled_mm at
    N = 128, slower at 8192^3 (the 2026-12-04 run's figures, rounded)."""
    base = KernelMeasurement(
        build_key=KEY,
        correctness_passed=True,
        device=H200,
        torch="2.12.0",
        shapes=["70b_tp8_wk_wv", "8192^3"],
        seconds=GemmSeconds(kernel=1.073e-3, scaled_mm=0.881e-3),
        per_shape=[WON, LOST],
    )
    return dataclasses.replace(base, **change)


def choose(capability, records, device=H200):
    return choose_backend(capability, {"sm90": records}, device, KEY)


def test_ada_runs_the_mma_sync_kernel_and_unknown_gpus_run_scaled_mm():
    assert choose((8, 9), [])[0] == "sm89_kernel"
    backend, reason = choose((10, 0), [record()])
    assert backend == "scaled_mm" and "sm_100" in reason


def test_hopper_loads_the_cutlass_kernel_only_where_it_measured_fastest_on_some_shape():
    backend, reason = choose((9, 0), [])
    assert backend == "scaled_mm" and "holds no GPU check" in reason  # never the mma.sync kernel on sm_90
    backend, reason = choose((9, 0), [record()])
    assert backend == "sm90_kernel" and "measured fastest (70b_tp8_wk_wv)" in reason and H200 in reason, reason
    assert "torch._scaled_mm on the other 1 measured shapes" in reason, reason
    backend, reason = choose((9, 0), [record(per_shape=[LOST])])
    assert backend == "scaled_mm" and "faster than every configuration of fp8_gemm_sm90.cu on all 1" in reason


@pytest.mark.parametrize("device", ["NVIDIA H100 PCIe", "NVIDIA GH200 480GB", "NVIDIA H100 80GB HBM3"])
def test_an_h200_measurement_switches_no_other_hopper(device):
    backend, reason = choose((9, 0), [record()], device=device)
    assert backend == "scaled_mm" and f"on {device} with build key {KEY.digest()}" in reason and H200 in reason


@pytest.mark.parametrize(
    "change",
    [
        {"nvcc_flags": [*KEY.nvcc_flags, "-lineinfo"]},
        {"nvcc": "release 12.8, V12.8.93"},
        {"cutlass": "4.1.0"},
        {"torch": "2.11.0"},
        {"sources_sha256": "0" * 64},
    ],
)
def test_a_measurement_of_another_build_key_does_not_hold(change):
    other = dataclasses.replace(KEY, **change)
    assert other.digest() != KEY.digest()
    assert choose((9, 0), [record(build_key=other)])[0] == "scaled_mm"
    assert choose((9, 0), [record(build_key=other), record()])[0] == "sm90_kernel"


def test_figures_kept_from_an_earlier_build_say_so():
    backend, reason = choose((9, 0), [record(measured_on="0a8a1c9466464c94")])
    assert backend == "sm90_kernel" and "(figures of build 0a8a1c9466464c94, before this build's sources)" in reason


def test_the_backend_can_be_forced_to_the_kernel(monkeypatch):
    monkeypatch.setenv("TRAINFLOW_FP8_BACKEND", "kernel")
    backend, reason = choose((9, 0), [])
    assert backend == "sm90_kernel" and "forced by TRAINFLOW_FP8_BACKEND=kernel" in reason


@pytest.mark.parametrize(
    ("change", "why"),
    [
        ({"per_shape": [ShapeTiming("8192^3", [8192, 8192, 8192], {"stream_k_s1": 1e-3})]}, "no shape timed against"),
        ({"correctness_passed": False}, "failed its GPU check"),
        ({"device": "NVIDIA H100 PCIe"}, "holds no GPU check"),
    ],
)
def test_hopper_stays_on_scaled_mm_when_the_measurement_does_not_hold(change, why):
    backend, reason = choose((9, 0), [record(**change)])
    assert backend == "scaled_mm" and why in reason, reason


def test_the_committed_measurements_are_records_of_known_kernels():
    assert {f.name for f in dataclasses.fields(Measurements)} == {b.arch for b in KERNEL_BUILDS.values()}
    measured = read_measured(kernels_folder())  # a file that is not Measurements raises
    assert all(isinstance(m, KernelMeasurement) for records in measured.values() for m in records)
    assert any(r.device == H200 and r.correctness_passed for r in measured["sm90"]), "the 2026-12-04 H200 check"


def test_the_committed_h200_figures_hold_for_these_sources_marked_as_measured_on_the_unsplit_build():
    """kernels/measured.json's H200 record: its key is these very sources' (with the GPU machine's nvcc, CUTLASS
    and torch), so a change of the kernel's sources fails here until the record is measured again or marked; its
    figures were timed on build 0a8a1c9466464c94, before the split into translation units."""
    record = next(r for r in read_measured(kernels_folder())["sm90"] if r.device == H200)
    old = record.build_key
    assert build_key(old.extension, SM90.key_files(), nvcc_flags(SM90), old.nvcc, old.torch) == old
    assert record.measured_on == "0a8a1c9466464c94" and old.torch == "2.11.0+cu130", record.measured_on


def test_the_committed_h200_figures_run_scaled_mm_at_8192_cubed_and_the_kernel_at_n_128():
    dispatch = committed(H200, sm_count=132)
    big, narrow = dispatch.choose(8192, 8192, 8192), dispatch.choose(8192, 128, 8192)
    assert big.runner == SCALED_MM and big.config is None, big.reason
    assert big.reason.startswith("scaled_mm: measured fastest here, 0.830 ms"), big.reason
    assert narrow.config is not None and narrow.runner == "pingpong_s1", narrow.reason
    assert "(70b_tp8_wk_wv on NVIDIA H200)" in narrow.reason, narrow.reason
    # Unmeasured shapes learn from the nearest measured one: N = 256 from N = 128, 2048^3 from 4096^3.
    assert dispatch.choose(8192, 256, 8192).runner == "pingpong_s1"
    near = dispatch.choose(2048, 2048, 2048)
    assert near.runner == SCALED_MM and "nearest measured shape, 4096^3 (4096x4096x4096, log2 distance 3.0)" in (
        near.reason
    ), near.reason


def test_measured_json_reads_back_and_an_altered_one_is_one_line_naming_the_field(tmp_path):
    (tmp_path / "measured.json").write_text(json.dumps({"sm89": [], "sm90": [record().to_json()]}))
    assert read_measured(tmp_path) == {"sm89": [], "sm90": [record()]}
    for change, message in [
        (lambda d: d["sm90"][0]["seconds"].update(kernel="fast"), r"sm90\[0\]\.seconds\.kernel holds 'fast', not a"),
        (lambda d: d["sm90"][0].pop("build_key"), r"sm90\[0\] lacks KernelMeasurement's field 'build_key'"),
        (lambda d: d.update(sm100={}), r"holds 'sm100', which Measurements has no field for"),
        (lambda d: d["sm90"][0].update(correctness_passed=1), r"sm90\[0\]\.correctness_passed holds 1, not a bool"),
    ]:
        data = {"sm89": [], "sm90": [record().to_json()]}
        change(data)
        (tmp_path / "measured.json").write_text(json.dumps(data))
        with pytest.raises(RecordError, match=r"measured\.json.*" + message) as err:
            read_measured(tmp_path)
        assert "\n" not in str(err.value) and "rerun scripts/gpu_check.sh" in str(err.value)


def test_the_kernels_folder_is_the_checkout_s_or_the_setting_s(tmp_path, monkeypatch):
    assert (kernels_folder() / SM90.source).is_file()  # this checkout's kernels/
    monkeypatch.setenv("TRAINFLOW_KERNELS", str(tmp_path))
    with pytest.raises(ConfigError, match=rf"{tmp_path} holds no fp8 kernels .*set TRAINFLOW_KERNELS"):
        kernels_folder()
    (tmp_path / "fp8_gemm.h").write_text("")
    assert kernels_folder() == tmp_path


def test_each_kernel_builds_one_native_target_without_ptx():
    for build in KERNEL_BUILDS.values():
        flags = nvcc_flags(build)
        targets = [f for f in flags if f.startswith("-gencode=")]
        assert targets == [f"-gencode={build.gencode}"] and ",code=sm_" in build.gencode  # no PTX for a JIT
        assert "-DNDEBUG" in flags  # CUTLASS's device asserts would serialise its wgmmas (ptxas C7510)
    assert SM90.gencode.endswith("sm_90a")  # wgmma needs the arch-specific target, not plain sm_90


def test_build_and_load_refuse_what_has_no_kernel(tmp_path):
    with pytest.raises(ConfigError, match="no fp8 kernel for sm_86"):
        build_extension((8, 6), tmp_path)
    assert load_backend(torch.device("cpu")) == "reference"
    assert backend_reason(torch.device("cpu")).startswith("reference: cpu: plain PyTorch")


# Llama 3 70B's linears at tp8 for 8192 tokens and 8192^3 (benchmarks/fp8_gemm.py's shapes), on 132 SMs (H100 SXM,
# H200): what the dispatch runs before any GPU check has measured them.
HEURISTIC = {
    (8192, 128, 8192): "stream_k_s1",  # wk / wv: 64 tiles on 132 SMs
    (8192, 1024, 8192): "cooperative_s8",  # wq
    (8192, 8192, 1024): "pingpong_s1",  # wo: K of 8 k-tiles
    (8192, 3584, 8192): "cooperative_s8",  # w1 / w3
    (8192, 8192, 3584): "cooperative_s8",  # w2
    (8192, 8192, 8192): "cooperative_s8",
    (4096, 4096, 4096): "cooperative_s1",  # its operands fit in L2
    (128, 8192, 8192): "stream_k_s1",  # wk's weight gradient: dY^T X
}


@pytest.mark.parametrize(("mnk", "name"), HEURISTIC.items())
def test_unmeasured_shapes_take_the_heuristic_s_configuration_saying_so(mnk, name):
    choice = heuristic(*mnk, sm_count=132)
    assert choice.config.name == name and choice.config in SM90_CONFIGS
    assert choice.reason.startswith(f"{name}: heuristic, not yet measured (") and "\n" not in choice.reason


def test_a_measured_shape_runs_its_fastest_and_the_others_the_nearest_measured_shape_s():
    timing = ShapeTiming("70b_tp8_wo", [8192, 8192, 1024], {"cooperative_s1": 2e-4, "pingpong_s1": 3e-4, "old": 1e-5})
    dispatch = ShapeDispatch([timing], H200, sm_count=132)
    assert dispatch.choose(8192, 8192, 1024).config.name == "cooperative_s1"  # a name no config has is ignored
    assert dispatch.choose(8192, 128, 8192).runner == "cooperative_s1"
    assert dispatch.choices() == {
        "8192x8192x1024": "cooperative_s1: measured fastest here, 0.200 ms of 2 measured, next pingpong_s1 0.300 ms "
        "(70b_tp8_wo on NVIDIA H200)",
        "8192x128x8192": "cooperative_s1: fastest at the nearest measured shape, 70b_tp8_wo (8192x8192x1024, log2 "
        "distance 9.0): 0.200 ms of 2 measured, next pingpong_s1 0.300 ms on NVIDIA H200",
    }
    assert ShapeDispatch([], H200, sm_count=132).choose(8192, 128, 8192) == heuristic(8192, 128, 8192, 132)


def test_a_forced_kernel_never_runs_scaled_mm_even_where_it_measured_faster():
    dispatch = ShapeDispatch([LOST], H200, sm_count=132, scaled_mm=False)
    choice = dispatch.choose(8192, 8192, 8192)
    assert choice.runner == "stream_k_s1" and choice.config is not None, choice.reason
    assert ShapeDispatch([LOST], H200, sm_count=132).choose(8192, 8192, 8192).config is None


def test_per_shape_timings_read_back_and_records_without_them_still_read(tmp_path):
    timed = record(per_shape=[ShapeTiming("8192^3", [8192, 8192, 8192], {"cooperative_s8": 1e-3})], measured_on="ab")
    (tmp_path / "measured.json").write_text(json.dumps({"sm89": [], "sm90": [timed.to_json()]}))
    assert read_measured(tmp_path)["sm90"] == [timed]
    old = record().to_json()
    del old["per_shape"], old["measured_on"]  # written before the configurations existed
    (tmp_path / "measured.json").write_text(json.dumps({"sm89": [], "sm90": [old]}))
    assert read_measured(tmp_path)["sm90"][0].per_shape == []


def test_the_sm90_op_takes_a_configuration_and_sm89_s_does_not():
    assert SM90.schema.endswith(", int schedule=0, int swizzle=1) -> Tensor")
    assert KERNEL_BUILDS[(8, 9)].schema == SCHEMA and DEFAULT == KernelConfig(Schedule.COOPERATIVE, 1)
    assert [int(s) for s in Schedule] == [0, 1, 2]  # fp8_gemm.h's Fp8GemmSchedule
