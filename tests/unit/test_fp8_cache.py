"""The fp8 kernels' build cache, on CPU (trainflow.fp8.cache, .build): keys, the lock that names its holder and is
taken over once stale, ranks that load a build or run torch._scaled_mm with one warning and never compile, and the
build_kernels stage's no-op where nothing can be compiled.

    .venv/bin/python -m pytest tests/unit/test_fp8_cache.py -q
"""

from __future__ import annotations

import dataclasses
import json
import subprocess
import sys
import threading
import time
import warnings

import pytest
import torch

from tests.conftest import make_config
from trainflow.errors import ConfigError
from trainflow.fp8 import build, kernels
from trainflow.fp8.build import BuildOutcome, KernelsReport, build_campaign_kernels, build_extension
from trainflow.fp8.cache import RECORD, BuildLock, BuildRecord, LockHolder, build_folder, cached_library, find_library
from trainflow.fp8.measured import GemmSeconds, KernelMeasurement
from trainflow.fp8.shapes import SCALED_MM, ShapeTiming
from trainflow.host import hostname
from trainflow.records import read_record
from trainflow.stages import build_kernels

SM90 = kernels.KERNEL_BUILDS[(9, 0)]


def dead_pid() -> int:
    process = subprocess.Popen([sys.executable, "-c", "pass"])
    process.wait()
    return process.pid


def write_lock(path, host: str, pid: int, started: float) -> None:
    path.write_text(json.dumps(LockHolder(host, pid, started).to_json()))


def fake_build(cache, key) -> None:
    """A complete build folder of `key` (its record and a library file), as build_extension leaves one."""
    folder = build_folder(cache, key)
    folder.mkdir(parents=True)
    (folder / f"{key.extension}.so").write_bytes(b"\x7fELF")
    record = BuildRecord(key=key, library=f"{key.extension}.so", host="builder", seconds=95.0)
    (folder / RECORD).write_text(json.dumps(record.to_json()))


@pytest.mark.parametrize(
    "holder",
    [
        pytest.param(lambda: (hostname(), dead_pid(), time.time()), id="holder-dead-on-this-host"),
        pytest.param(lambda: ("other-node", 1, time.time() - 3600), id="older-than-the-timeout"),
    ],
)
def test_a_stale_lock_is_taken_over(tmp_path, holder):
    lock_path = tmp_path / "x.lock"
    host, pid, started = holder()
    write_lock(lock_path, host, pid, started)
    start = time.monotonic()
    with BuildLock(lock_path, timeout_s=600, poll_s=0.05) as lock:
        assert lock.taken_over == LockHolder(host, pid, started)
        assert read_record(LockHolder, lock_path).pid == lock.me.pid  # ours now, naming us
    assert time.monotonic() - start < 5 and not lock_path.exists()
    assert list(tmp_path.iterdir()) == []  # the stale lock moved aside is gone too


def test_a_live_holder_is_waited_for_until_it_releases_or_its_lock_times_out(tmp_path):
    lock_path = tmp_path / "x.lock"
    write_lock(lock_path, "other-node", 1, time.time())  # fresh, on a host whose processes we cannot see
    threading.Timer(0.5, lock_path.unlink).start()
    start = time.monotonic()
    with BuildLock(lock_path, timeout_s=600, poll_s=0.05) as lock:
        assert lock.taken_over is None
    assert time.monotonic() - start >= 0.5
    write_lock(lock_path, "other-node", 1, time.time())  # never released: taken over once older than 1 s
    with BuildLock(lock_path, timeout_s=1.0, poll_s=0.05) as lock:
        assert lock.taken_over is not None and lock.taken_over.host == "other-node"
    assert 1.0 <= time.monotonic() - start


def test_a_rank_loads_only_its_key_s_build(tmp_path):
    key = kernels.kernel_key(SM90)
    assert cached_library(tmp_path, key)[0] is None
    other = dataclasses.replace(key, nvcc="release 12.8, V12.8.93")
    fake_build(tmp_path, other)
    library, fact = cached_library(tmp_path, key)
    assert library is None and f"for key {key.digest()}" in fact
    assert f"other keys only ({build_folder(tmp_path, other).name})" in fact
    fake_build(tmp_path, key)
    library, fact = cached_library(tmp_path, key)
    assert library == build_folder(tmp_path, key) / "trainflow_fp8_sm90.so" and "built on builder in 95 s" in fact
    library.unlink()  # an incomplete folder is not a build
    assert cached_library(tmp_path, key)[0] is None


def test_a_rank_without_a_build_runs_scaled_mm_at_once_with_one_warning_and_never_compiles(tmp_path, monkeypatch):
    from torch.utils import cpp_extension

    monkeypatch.setattr(cpp_extension, "load", lambda *a, **k: pytest.fail("a rank compiled"))
    won = ShapeTiming("70b_tp8_wk_wv", [8192, 128, 8192], {"pingpong_s1": 4.3e-5, SCALED_MM: 5.1e-5})
    record = KernelMeasurement(kernels.kernel_key(SM90), True, "NVIDIA H200", "2.12.0", [won.shape], GemmSeconds(1, 1))
    measured = {"sm89": [], "sm90": [dataclasses.replace(record, per_shape=[won])]}
    monkeypatch.setattr(kernels, "read_measured", lambda folder: measured)  # the dispatch would load the kernel
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        backend, reason = kernels._load_cuda((9, 0), "NVIDIA H200", tmp_path)
    assert backend == "scaled_mm" and f"{tmp_path} holds no build of trainflow_fp8_sm90" in reason
    assert [str(w.message).count("torch._scaled_mm runs the fp8 GEMMs instead") for w in caught] == [1]


def test_a_forced_kernel_without_a_build_fails_in_one_line_naming_the_cache_and_the_build(tmp_path, monkeypatch):
    from torch.utils import cpp_extension

    monkeypatch.setattr(cpp_extension, "load", lambda *a, **k: pytest.fail("a rank compiled"))
    monkeypatch.setenv("TRAINFLOW_FP8_BACKEND", "kernel")
    monkeypatch.setenv("TRAINFLOW_KERNEL_CACHE", str(tmp_path / "image"))
    with pytest.raises(ConfigError) as err:
        kernels._load_cuda((9, 0), "NVIDIA H200", tmp_path / "run")
    message = str(err.value)
    assert "\n" not in message and message.startswith("TRAINFLOW_FP8_BACKEND=kernel, but "), message
    assert f"{tmp_path}/run holds no build of trainflow_fp8_sm90" in message, message
    assert f"{tmp_path}/image holds no build" in message, message
    assert "build it with `python -m trainflow.fp8 --arch sm90 CACHE`" in message, message


def test_a_build_waiting_on_a_dead_builder_s_lock_finds_the_cache_without_compiling(tmp_path, monkeypatch):
    from torch.utils import cpp_extension

    monkeypatch.setattr(cpp_extension, "load", lambda *a, **k: pytest.fail("compiled a cached build"))
    key = kernels.kernel_key(SM90)
    fake_build(tmp_path, key)
    write_lock(tmp_path / f"{key.extension}.lock", hostname(), dead_pid(), time.time())
    build, library, what = build_extension((9, 0), tmp_path)
    assert build == SM90 and library.name == "trainflow_fp8_sm90.so" and what.startswith("cached: built on builder")
    assert not (tmp_path / f"{key.extension}.lock").exists()


def test_the_stage_is_a_no_op_saying_why_where_nothing_can_be_compiled(tmp_path, monkeypatch):
    cfg = make_config("build_kernels", tmp_path, "train.precision=bf16", "train.fp8=delayed")
    build_kernels.run(cfg)
    report = read_record(KernelsReport, cfg.io.kernels_report)
    assert report.outcome == BuildOutcome.SKIPPED and "\n" not in report.reason
    if not torch.cuda.is_available():
        assert report.reason.startswith("no CUDA GPU here")
    assert not any(tmp_path.rglob("*.so"))
    none = build_campaign_kernels("none", tmp_path / "cache")
    assert none.outcome == BuildOutcome.SKIPPED and none.reason.startswith("train.fp8=none")
    monkeypatch.setattr(build, "find_nvcc", lambda: None)
    toolless = build_campaign_kernels("delayed", tmp_path / "cache", capability=(9, 0))
    assert toolless.outcome == BuildOutcome.SKIPPED and toolless.reason.startswith("no CUDA toolkit here")


def test_a_rank_finds_a_container_image_s_prebuilt_build_when_the_run_s_cache_has_none(tmp_path, monkeypatch):
    key = kernels.kernel_key(SM90)
    image, run = tmp_path / "image", tmp_path / "run"
    fake_build(image, key)
    assert find_library(run, key)[0] is None
    monkeypatch.setenv("TRAINFLOW_KERNEL_CACHE", str(image))  # containers/trainflow.def's %environment
    library, fact = find_library(run, key)
    assert library == build_folder(image, key) / "trainflow_fp8_sm90.so" and "built on builder" in fact
