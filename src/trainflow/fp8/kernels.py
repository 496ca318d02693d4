"""The fp8 GEMM kernels in kernels/, one per architecture, their build, and which implementation of
trainflow::fp8_gemm runs on a GPU, chosen by measured fact (trainflow.fp8.ops declares the op).

    python -m trainflow.fp8        # on a GPU node: build the kernel of the visible GPU's architecture

`load_backend(device)` makes the op runnable on `device` and names the implementation; `backend_reason(device)`
says in one line which runs and the fact that chose it (the rules are trainflow.fp8.ops' docstring's).

The kernels' folder is $TRAINFLOW_KERNELS where set, else the kernels/ of the checkout trainflow is imported from
(src/trainflow/fp8 -> kernels/); an install without either is told so in one line when it first needs a kernel.
"""

from __future__ import annotations

import functools
import hashlib
import importlib.util
import os
import warnings
from dataclasses import dataclass
from pathlib import Path

import torch

from trainflow.errors import ConfigError
from trainflow.fp8.ops import OP, SCHEMA, scaled_mm_fp8_gemm
from trainflow.records import Record, read_record

KERNELS_ENV = "TRAINFLOW_KERNELS"
CHECKOUT_KERNELS = Path(__file__).resolve().parents[3] / "kernels"
"""Where kernels/ lies in a checkout (src/trainflow/fp8/kernels.py -> the repository's root)."""
MEASURED = "measured.json"
EXTENSION = "trainflow_fp8"  # one extension per architecture: trainflow_fp8_sm89, trainflow_fp8_sm90
BUILD_HINT = "build it on a GPU node with `python -m trainflow.fp8` (needs nvcc and CUDA_HOME; kernels/README.md)"


@dataclass(frozen=True)
class KernelBuild:
    """One architecture's kernel: its source in kernels/, its nvcc target, and the torch op its binding registers."""

    arch: str  # "sm89" | "sm90": the op is trainflow::fp8_gemm_<arch>, the extension EXTENSION_<arch>
    source: str
    gencode: str
    cutlass: bool  # needs the CUTLASS headers of the nvidia-cutlass wheel

    @property
    def op(self) -> str:
        return f"trainflow::fp8_gemm_{self.arch}"

    @property
    def define(self) -> str:
        return f"TRAINFLOW_FP8_{self.arch.upper()}"

    def sources(self) -> list[Path]:
        return [kernels_folder() / self.source, kernels_folder() / "fp8_binding.cpp"]


@dataclass(frozen=True)
class GemmSeconds(Record):
    """Seconds summed over the benchmark's shapes (benchmarks/fp8_gemm.py)."""

    kernel: float
    scaled_mm: float


@dataclass(frozen=True)
class KernelMeasurement(Record):
    """One architecture's last GPU check: kernels/measured.json holds {arch: KernelMeasurement}, the "measured" of
    benchmarks/fp8_gemm.py's output, which scripts/gpu_check.sh writes out."""

    kernel_sha256: str
    """Of the sources measured (kernel_sha256): a measurement holds for these bytes only."""
    correctness_passed: bool
    device: str
    torch: str
    shapes: list[str]
    """The benchmark's shapes the seconds sum over."""
    seconds: GemmSeconds


def kernels_folder() -> Path:
    """The folder of the kernels' sources and measured.json (module docstring); one ConfigError if there is none."""
    folder = Path(os.environ[KERNELS_ENV]) if os.environ.get(KERNELS_ENV) else CHECKOUT_KERNELS
    if not (folder / "fp8_gemm.h").is_file():
        raise ConfigError(
            f"{folder} holds no fp8 kernels (fp8_gemm.h): trainflow is not imported from a checkout; set "
            f"{KERNELS_ENV} to the kernels/ folder of one"
        )
    return folder


KERNEL_BUILDS = {
    (8, 9): KernelBuild("sm89", "fp8_gemm.cu", "arch=compute_89,code=sm_89", cutlass=False),
    (9, 0): KernelBuild("sm90", "fp8_gemm_sm90.cu", "arch=compute_90a,code=sm_90a", cutlass=True),
}

for _build in KERNEL_BUILDS.values():  # the per-architecture ops the bindings register
    torch.library.define(_build.op, SCHEMA)


def cutlass_include() -> Path:
    """The CUTLASS/CuTe headers inside the nvidia-cutlass wheel (package data of its cutlass_library module)."""
    spec = importlib.util.find_spec("cutlass_library")  # finds the package without importing it (and its deps)
    if spec is None or not spec.submodule_search_locations:
        raise ImportError("the nvidia-cutlass wheel is not installed (pip install -e '.[test]' pins it)")
    include = Path(next(iter(spec.submodule_search_locations))) / "source/include"
    if not (include / "cutlass/cutlass.h").is_file():
        raise ImportError(f"{include}/cutlass/cutlass.h missing: the nvidia-cutlass wheel holds no C++ headers")
    return include


def nvcc_flags(build: KernelBuild) -> list[str]:
    """nvcc's flags for `build`'s .cu: one machine-code target and no PTX (so the kernel runs only where its
    instructions are native); -DNDEBUG because CUTLASS's device asserts are calls, and a call inside its mainloop
    makes ptxas serialise the wgmmas (warning C7510). tests/unit/test_fp8_sass.py compiles with these too."""
    flags = [f"-gencode={build.gencode}", "-O3", "-DNDEBUG", "-std=c++17", "--expt-relaxed-constexpr"]
    return flags + (["-isystem", str(cutlass_include())] if build.cutlass else [])


def build_extension(verbose: bool = False, capability: tuple[int, int] | None = None) -> KernelBuild:
    """Compile the kernel for `capability` (default: the current GPU's) with its binding, through
    torch.utils.cpp_extension (cached under TORCH_EXTENSIONS_DIR), and load it, which registers the kernel's op.
    Raises what the build raises, and ConfigError where kernels/ has no kernel for the capability."""
    from torch.utils import cpp_extension  # imported here: it probes for compilers and CUDA at import

    capability = capability or torch.cuda.get_device_capability()
    if capability not in KERNEL_BUILDS:
        raise ConfigError(f"kernels/ has no fp8 kernel for sm_{capability[0]}{capability[1]} (only sm_89, sm_90)")
    build = KERNEL_BUILDS[capability]
    if missing := [str(p) for p in build.sources() if not p.is_file()]:
        raise FileNotFoundError(f"{', '.join(missing)} missing (trainflow is not installed from a checkout)")
    cpp_extension.load(
        name=f"{EXTENSION}_{build.arch}",
        sources=[str(p) for p in build.sources()],
        extra_include_paths=[str(kernels_folder())],
        extra_cflags=["-O3", f"-D{build.define}"],
        extra_cuda_cflags=nvcc_flags(build),
        is_python_module=False,
        verbose=verbose,
    )
    return build


def kernel_sha256(build: KernelBuild) -> str:
    """SHA-256 of the files that make `build`'s kernel: a measurement holds for these bytes only."""
    digest = hashlib.sha256()
    for path in [*build.sources(), kernels_folder() / "fp8_gemm.h"]:
        digest.update(path.read_bytes())
    return digest.hexdigest()


def measured_faster(record: KernelMeasurement | None, build: KernelBuild) -> tuple[bool, str]:
    """Whether kernels/measured.json's `record` for `build` shows the kernel correct and no slower than
    torch._scaled_mm on these sources; and the fact, in words."""
    if record is None:
        return False, f"kernels/{MEASURED} holds no GPU check of {build.source} (scripts/gpu_check.sh records one)"
    if record.kernel_sha256 != kernel_sha256(build):
        return False, f"kernels/{MEASURED} measured other sources than today's {build.source} (SHA-256 differs)"
    if not record.correctness_passed:
        return False, f"{build.source} failed its GPU check against the reference ({record.device})"
    kernel_s, scaled_mm_s = record.seconds.kernel, record.seconds.scaled_mm
    fact = f"{scaled_mm_s / kernel_s:.3f}x torch._scaled_mm's speed over the benchmark's shapes on {record.device}"
    return kernel_s <= scaled_mm_s, f"{build.source} measured at {fact}"


def choose_backend(capability: tuple[int, int], measured: dict[str, KernelMeasurement]) -> tuple[str, str]:
    """(backend, reason) for a GPU of `capability`, before any build: see the module docstring's rules."""
    name = f"sm_{capability[0]}{capability[1]}"
    build = KERNEL_BUILDS.get(capability)
    if build is None:
        return "scaled_mm", f"{name}: kernels/ has no fp8 kernel for it, so torch._scaled_mm (cuBLASLt) runs"
    if build.arch == "sm89":
        return "sm89_kernel", f"{name}: {build.source} (mma.sync fp8, native on Ada, fp32 promotion every 128 of K)"
    faster, fact = measured_faster(measured.get(build.arch), build)
    if faster:
        return "sm90_kernel", f"{name}: {build.source} (CUTLASS wgmma + TMA): {fact}"
    return "scaled_mm", f"{name}: torch._scaled_mm (cuBLASLt), because {fact}"


@dataclass(frozen=True)
class Measurements(Record):
    """kernels/measured.json, by architecture (KernelBuild.arch); an architecture not measured is absent."""

    sm89: KernelMeasurement | None = None
    sm90: KernelMeasurement | None = None

    def by_arch(self) -> dict[str, KernelMeasurement]:
        return {arch: m for arch, m in vars(self).items() if m is not None}


def read_measured(folder: Path | None = None) -> dict[str, KernelMeasurement]:
    """kernels/measured.json: {arch: the record of its last GPU check}; {} while nothing has been measured. One
    RecordError naming the file and the field where it is not Measurements."""
    path = (folder or kernels_folder()) / MEASURED
    if not path.is_file():
        return {}
    return read_record(Measurements, path, rerun="scripts/gpu_check.sh and commit its measured.json").by_arch()


def load_backend(device: torch.device) -> str:
    """Make fp8_gemm runnable on `device`; which implementation will run there: "reference" (CPU),
    "sm89_kernel", "sm90_kernel" or "scaled_mm". `backend_reason` says why."""
    return _backend(device)[0]


def backend_reason(device: torch.device) -> str:
    """One line: which fp8_gemm implementation runs on `device`, and the fact that chose it."""
    backend, reason = _backend(device)
    return f"{backend}: {reason}"


def _backend(device: torch.device) -> tuple[str, str]:
    if device.type == "cpu":
        return "reference", "cpu: plain PyTorch, fp32 sums of exact fp8 products (the test oracle)"
    if device.type != "cuda":
        raise ConfigError(f"train.fp8 runs on cpu or cuda devices, not {device.type}: set train.fp8=none")
    index = device.index if device.index is not None else torch.cuda.current_device()
    capability = torch.cuda.get_device_capability(index)
    if capability < (8, 9):
        raise ConfigError(
            f"train.fp8 needs fp8 tensor cores (compute capability >= 8.9: Ada, Hopper); "
            f"{torch.cuda.get_device_name(index)} is {capability[0]}.{capability[1]}: set train.fp8=none"
        )
    return _load_cuda(capability)


@functools.cache
def _load_cuda(capability: tuple[int, int]) -> tuple[str, str]:
    """Once per process: choose, build the chosen kernel, and register it (or _scaled_mm) as fp8_gemm's CUDA
    implementation. The registration is process-wide, so a second capability in one process is refused."""
    if _load_cuda.cache_info().currsize > 0:
        raise ConfigError(
            f"fp8_gemm's CUDA implementation is chosen once per process; sm_{capability[0]}"
            f"{capability[1]} is a second GPU architecture here: run one architecture per process"
        )
    backend, reason = choose_backend(capability, read_measured())
    if backend != "scaled_mm":
        try:
            build = build_extension(capability=capability)
        except (RuntimeError, OSError, ImportError) as err:
            failure = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
            warnings.warn(
                f"trainflow.fp8: {KERNEL_BUILDS[capability].source} did not build ({failure}); torch._scaled_mm "
                f"runs the fp8 GEMMs instead: {BUILD_HINT}",
                stacklevel=4,
            )
            name, source = f"sm_{capability[0]}{capability[1]}", KERNEL_BUILDS[capability].source
            backend, reason = (
                "scaled_mm",
                f"{name}: torch._scaled_mm (cuBLASLt), because {source} did not build: {failure}",
            )
        else:
            torch.library.impl(OP, "cuda")(_kernel_op(build))
            return backend, reason
    torch.library.impl(OP, "cuda")(scaled_mm_fp8_gemm)
    return backend, reason


def _kernel_op(build: KernelBuild):
    """fp8_gemm's CUDA implementation through `build`'s op (registered by the extension just loaded)."""
    kernel = getattr(torch.ops.trainflow, f"fp8_gemm_{build.arch}").default

    def run_kernel(a, b, scale_a, scale_b, out_dtype):
        return kernel(a, b, scale_a, scale_b, out_dtype)

    return run_kernel
