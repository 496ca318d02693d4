"""Compile kernels/ into the build cache (trainflow.fp8.cache), once per campaign: the build_kernels stage, a
container image's build and `python -m trainflow.fp8` call `build_extension`; ranks only load what it leaves.

    python -m trainflow.fp8 --arch sm90 runs/default/kernels
"""

from __future__ import annotations

import enum
import functools
import os
import shutil
import time
from dataclasses import dataclass
from pathlib import Path

import torch

from trainflow.atomic import write_json
from trainflow.errors import ConfigError
from trainflow.fp8.cache import (
    LOCK_TIMEOUT_S,
    RECORD,
    BuildLock,
    BuildRecord,
    build_folder,
    cached_library,
    find_library,
    find_nvcc,
)
from trainflow.fp8.kernels import (
    KERNEL_BUILDS,
    KernelBuild,
    choose_backend,
    kernel_key,
    kernels_folder,
    nvcc_flags,
)
from trainflow.fp8.measured import read_measured
from trainflow.records import Record


def build_blocker() -> str | None:
    """Why no kernel can be compiled here (no nvcc, a CPU build of torch), or None."""
    if find_nvcc() is None:
        return "no CUDA toolkit here (nvcc not found in $CUDA_HOME/bin, PATH or /usr/local/cuda)"
    if torch.version.cuda is None:
        return f"torch {torch.__version__} is a CPU build (an extension links against torch's CUDA libraries)"
    return None


def build_extension(
    capability: tuple[int, int], cache: Path, verbose: bool = False, lock_timeout_s: float = LOCK_TIMEOUT_S
) -> tuple[KernelBuild, Path, str]:
    """Compile the kernel for `capability` (no GPU needed) with its binding into `cache`, unless its key's build is
    there already: (the build, its library, what happened). Under BuildLock, in a folder private to this process,
    renamed into place whole (trainflow.fp8.cache). Raises what the build raises, ConfigError where kernels/ has no
    kernel for the capability."""
    from torch.utils import cpp_extension  # imported here: it probes for compilers and CUDA at import

    build = kernel_build(capability)
    key = kernel_key(build)
    with BuildLock(cache / f"{key.extension}.lock", lock_timeout_s) as lock:
        library, fact = cached_library(cache, key)
        if library is not None:
            return build, library, f"cached: {fact}"
        private = cache / f".{key.extension}-{key.digest()}.{lock.me.host}.{lock.me.pid}"
        shutil.rmtree(private, ignore_errors=True)
        private.mkdir(parents=True)
        start = time.perf_counter()
        cpp_extension.load(
            name=key.extension,
            sources=[str(p) for p in build.sources()],
            extra_include_paths=[str(kernels_folder())],
            extra_cflags=["-O3", f"-D{build.define}"],
            extra_cuda_cflags=nvcc_flags(build),
            build_directory=str(private),
            is_python_module=False,
            verbose=verbose,
        )
        seconds = round(time.perf_counter() - start, 1)
        record = BuildRecord(key=key, library=f"{key.extension}.so", host=lock.me.host, seconds=seconds)
        write_json(private / RECORD, record.to_json())
        folder = build_folder(cache, key)
        shutil.rmtree(folder, ignore_errors=True)  # an incomplete build of the key (its record said so)
        os.rename(private, folder)
        taken = f", after taking over {lock.taken_over.describe()}'s stale lock" if lock.taken_over else ""
        return build, folder / record.library, f"built in {seconds} s, key {key.digest()}{taken}"


def kernel_build(capability: tuple[int, int]) -> KernelBuild:
    """kernels/' build for `capability`, its sources present; one ConfigError or FileNotFoundError otherwise."""
    if capability not in KERNEL_BUILDS:
        raise ConfigError(f"kernels/ has no fp8 kernel for sm_{capability[0]}{capability[1]} (only sm_89, sm_90)")
    build = KERNEL_BUILDS[capability]
    if missing := [str(p) for p in build.sources() if not p.is_file()]:
        raise FileNotFoundError(f"{', '.join(missing)} missing (trainflow is not installed from a checkout)")
    return build


class BuildOutcome(enum.StrEnum):
    BUILT = "built"
    CACHED = "cached"
    SKIPPED = "skipped"


@dataclass(frozen=True)
class KernelsReport(Record):
    """build_kernels' record (io.kernels_report): what the campaign's ranks will find in the build cache."""

    outcome: BuildOutcome
    reason: str
    """In one line: what was built or found, or why nothing was."""
    cache: str
    arch: str | None = None
    key: str | None = None
    """The build key's digest (trainflow.fp8.cache.BuildKey)."""
    library: str | None = None


def build_campaign_kernels(fp8: str, cache: Path, capability: tuple[int, int] | None = None) -> KernelsReport:
    """Compile every kernel the campaign's ranks will dispatch on this node's GPU architecture (`capability`, else
    the visible GPU's) into `cache`: none under train.fp8=none, without a GPU, a CUDA toolkit or a CUDA build of
    torch, or where the dispatch runs torch._scaled_mm anyway (trainflow.fp8.kernels.choose_backend)."""
    skip = functools.partial(KernelsReport, BuildOutcome.SKIPPED, cache=str(cache))
    if fp8 == "none":
        return skip("train.fp8=none: the campaign runs no fp8 GEMMs, so no kernel to build")
    if capability is None and not torch.cuda.is_available():
        return skip("no CUDA GPU here, so no architecture to build for; ranks on GPUs will run torch._scaled_mm")
    capability = capability or torch.cuda.get_device_capability()
    if blocker := build_blocker():
        return skip(f"{blocker}: nothing compiled; ranks will run torch._scaled_mm")
    build = KERNEL_BUILDS.get(capability)
    device = torch.cuda.get_device_name() if torch.cuda.is_available() else ""
    key = kernel_key(build) if build is not None else None
    backend, why = choose_backend(capability, read_measured(kernels_folder()), device, key)
    if backend == "scaled_mm":
        return skip(f"the dispatch runs torch._scaled_mm here, so nothing to build: {why}")
    library, what = find_library(cache, key)  # a container image's prebuilt cache may hold it already
    outcome = BuildOutcome.CACHED
    if library is None:
        build, library, what = build_extension(capability, cache)
        outcome = BuildOutcome.CACHED if what.startswith("cached") else BuildOutcome.BUILT
    return KernelsReport(outcome, f"{build.source}: {what}", str(cache), build.arch, key.digest(), str(library))
