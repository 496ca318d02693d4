"""How kernels/ is built and chosen, on CPU: load_backend's rules per compute capability and the measured facts
they read from kernels/measured.json (the compiles themselves and their SASS: tests/unit/test_fp8_sass.py).

    .venv/bin/python -m pytest tests/unit/test_fp8_kernel_build.py -q
"""

from __future__ import annotations

import dataclasses
import json

import pytest
import torch

from trainflow.errors import ConfigError
from trainflow.fp8.kernels import (
    KERNEL_BUILDS,
    GemmSeconds,
    KernelMeasurement,
    Measurements,
    backend_reason,
    build_extension,
    choose_backend,
    kernel_sha256,
    kernels_folder,
    load_backend,
    nvcc_flags,
    read_measured,
)
from trainflow.records import RecordError

SM90 = KERNEL_BUILDS[(9, 0)]


def record(**change) -> KernelMeasurement:
    """A GPU check's record of today's sm90 sources that passed and ran 5 % faster than _scaled_mm."""
    base = KernelMeasurement(
        kernel_sha256=kernel_sha256(SM90),
        correctness_passed=True,
        device="NVIDIA H200",
        torch="2.12.0",
        shapes=["4096^3", "8192^3"],
        seconds=GemmSeconds(kernel=0.95, scaled_mm=1.0),
    )
    return dataclasses.replace(base, **change)


def test_ada_runs_the_mma_sync_kernel_and_unknown_gpus_run_scaled_mm():
    assert choose_backend((8, 9), {})[0] == "sm89_kernel"
    backend, reason = choose_backend((10, 0), {"sm90": record()})
    assert backend == "scaled_mm" and "sm_100" in reason


def test_hopper_runs_the_cutlass_kernel_only_once_measured_no_slower_than_scaled_mm():
    backend, reason = choose_backend((9, 0), {})
    assert backend == "scaled_mm" and "holds no GPU check" in reason  # never the mma.sync kernel on sm_90
    backend, reason = choose_backend((9, 0), {"sm90": record()})
    assert backend == "sm90_kernel" and "1.053x torch._scaled_mm" in reason and "NVIDIA H200" in reason
    assert choose_backend((9, 0), {"sm90": record(seconds=GemmSeconds(kernel=1.0, scaled_mm=1.0))})[0] == "sm90_kernel"


@pytest.mark.parametrize(
    ("change", "why"),
    [
        ({"seconds": GemmSeconds(kernel=1.1, scaled_mm=1.0)}, "0.909x torch._scaled_mm"),
        ({"correctness_passed": False}, "failed its GPU check"),
        ({"kernel_sha256": "0" * 64}, "other sources"),  # the kernel changed since it was measured
    ],
)
def test_hopper_stays_on_scaled_mm_when_the_measurement_does_not_hold(change, why):
    backend, reason = choose_backend((9, 0), {"sm90": record(**change)})
    assert backend == "scaled_mm" and why in reason


def test_the_committed_measurements_are_records_of_known_kernels():
    assert {f.name for f in dataclasses.fields(Measurements)} == {b.arch for b in KERNEL_BUILDS.values()}
    measured = read_measured()  # {} until a GPU check is committed; a file that is not Measurements raises
    assert all(isinstance(m, KernelMeasurement) for m in measured.values())


def test_measured_json_reads_back_and_an_altered_one_is_one_line_naming_the_field(tmp_path):
    (tmp_path / "measured.json").write_text(json.dumps({"sm90": record().to_json()}))
    assert read_measured(tmp_path) == {"sm90": record()}
    for change, message in [
        (lambda d: d["sm90"]["seconds"].update(kernel="fast"), r"sm90\.seconds\.kernel holds 'fast', not a float"),
        (lambda d: d["sm90"].pop("kernel_sha256"), r"sm90 lacks KernelMeasurement's field 'kernel_sha256'"),
        (lambda d: d.update(sm100={}), r"holds 'sm100', which Measurements has no field for"),
        (lambda d: d["sm90"].update(correctness_passed=1), r"sm90\.correctness_passed holds 1, not a bool"),
    ]:
        data = {"sm90": record().to_json()}
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


def test_build_and_load_refuse_what_has_no_kernel():
    with pytest.raises(ConfigError, match="no fp8 kernel for sm_86"):
        build_extension(capability=(8, 6))
    assert load_backend(torch.device("cpu")) == "reference"
    assert backend_reason(torch.device("cpu")).startswith("reference: cpu: plain PyTorch")
