"""The fp8 GEMM kernels in kernels/, one per architecture, their build keys, and which implementation of
trainflow::fp8_gemm runs on a GPU, chosen by measured fact (trainflow.fp8.ops declares the op).

    python -m trainflow.fp8 --arch sm90 CACHE    # compile (trainflow.fp8.build) into a build cache, no GPU needed

`load_backend(device, kernel_cache)` makes the op runnable on `device`, loading a kernel's build from the cache
(trainflow.fp8.cache) and never compiling, and names the implementation; `backend_reason(device)` says in one line
which runs and the fact that chose it (the rules are trainflow.fp8.ops' docstring's). kernels/measured.json holds a
GPU check per device name and build key: per benchmark shape, the seconds of every configuration of the sm90 kernel
and of torch._scaled_mm; the kernel is loaded where it measured fastest on some shape, and then each GEMM shape runs
the fastest measured there, or at the nearest measured shape (trainflow.fp8.dispatch); `shape_choices()` lists which
ran for each shape so far and why. $TRAINFLOW_FP8_BACKEND=kernel forces the kernel on every shape
(scripts/gpu_check.sh's tests); with no usable build that is one ConfigError naming the cache and the build command,
never a silent _scaled_mm.

The kernels' folder is $TRAINFLOW_KERNELS where set, else the kernels/ of the checkout trainflow is imported from
(src/trainflow/fp8 -> kernels/); an install without either is told so in one line when it first needs a kernel.
"""

from __future__ import annotations

import importlib.util
import os
import warnings
from dataclasses import dataclass
from pathlib import Path

import torch

from trainflow.errors import ConfigError
from trainflow.fp8.cache import BuildKey, build_key, find_library, find_nvcc, nvcc_release
from trainflow.fp8.dispatch import ShapeDispatch
from trainflow.fp8.measured import MEASURED, KernelMeasurement, by_measurement, measured_record, read_measured
from trainflow.fp8.ops import OP, SCHEMA, scaled_mm_fp8_gemm
from trainflow.fp8.shapes import SM90_CONFIGS, KernelConfig, Schedule, ShapeTiming

KERNELS_ENV = "TRAINFLOW_KERNELS"
CHECKOUT_KERNELS = Path(__file__).resolve().parents[3] / "kernels"
"""Where kernels/ lies in a checkout (src/trainflow/fp8/kernels.py -> the repository's root)."""
EXTENSION = "trainflow_fp8"  # one extension per architecture: trainflow_fp8_sm89, trainflow_fp8_sm90
FORCE_ENV = "TRAINFLOW_FP8_BACKEND"
BUILD_HINT = "the build_kernels stage, or `python -m trainflow.fp8 --arch ARCH CACHE`, builds it (kernels/README.md)"


@dataclass(frozen=True)
class KernelBuild:
    """One architecture's kernel: its sources in kernels/, its nvcc target, and the torch op its binding registers."""

    arch: str  # "sm89" | "sm90": the op is trainflow::fp8_gemm_<arch>, the extension EXTENSION_<arch>
    source: str
    """The .cu with the C interface's entry points (fp8_gemm.h), which names the kernel in reasons."""
    gencode: str
    cutlass: bool  # needs the CUTLASS headers of the nvidia-cutlass wheel
    configs: tuple[KernelConfig, ...] = ()
    """The configurations its op takes (schedule, swizzle: trainflow.fp8.shapes); () where it has one."""
    units: tuple[str, ...] = ()
    """Its other translation units, compiled in parallel with `source` (MAX_JOBS): the sm90 kernel's one per
    configuration."""
    headers: tuple[str, ...] = ()
    """Its own headers beside fp8_gemm.h: in the build key, as the sources are."""

    @property
    def op(self) -> str:
        return f"trainflow::fp8_gemm_{self.arch}"

    @property
    def schema(self) -> str:
        return SCHEMA.replace(") ->", ", int schedule=0, int swizzle=1) ->") if self.configs else SCHEMA

    @property
    def define(self) -> str:
        return f"TRAINFLOW_FP8_{self.arch.upper()}"

    def sources(self) -> list[Path]:
        """What the build compiles: every translation unit and the binding."""
        return [kernels_folder() / name for name in (self.source, *self.units, "fp8_binding.cpp")]

    def key_files(self) -> list[Path]:
        """Every file whose bytes make its machine code: the sources and the headers (its build key's)."""
        return [*self.sources(), *(kernels_folder() / h for h in ("fp8_gemm.h", *self.headers))]

    def kernel_units(self) -> list[Path]:
        """The translation units of the kernel itself (no binding): what tests/unit/test_fp8_sass.py compiles."""
        return [kernels_folder() / name for name in (self.source, *self.units)]


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
    (9, 0): KernelBuild(
        "sm90",
        "fp8_gemm_sm90.cu",
        "arch=compute_90a,code=sm_90a",
        cutlass=True,
        configs=SM90_CONFIGS,
        units=tuple(f"fp8_gemm_sm90_{s.name.lower()}_{a}.cu" for s in Schedule for a in ("e4m3", "e5m2")),
        headers=("fp8_gemm_sm90.h", "fp8_gemm_sm90.cuh"),
    ),
}

for _build in KERNEL_BUILDS.values():  # the per-architecture ops the bindings register
    torch.library.define(_build.op, _build.schema)


def committed(device: str, *, sm_count: int, folder: Path | None = None) -> ShapeDispatch:
    """The dispatch kernels/measured.json's newest sm90 record of `device` gives, whatever its build (a look at the
    committed figures; ranks use their own build's record: _kernel_op)."""
    records = [r for r in read_measured(folder or kernels_folder()).get("sm90", []) if r.device == device]
    if not records:
        raise LookupError(f"kernels/measured.json holds no sm90 record of {device}: scripts/gpu_check.sh records one")
    return ShapeDispatch(records[-1].per_shape, device, sm_count=sm_count)


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


def kernel_key(build: KernelBuild) -> BuildKey:
    """The build-cache key of `build` with this machine's nvcc, CUTLASS and torch (trainflow.fp8.cache)."""
    nvcc = nvcc_release(find_nvcc())
    return build_key(f"{EXTENSION}_{build.arch}", build.key_files(), nvcc_flags(build), nvcc, torch.__version__)


def forced() -> bool:
    """$TRAINFLOW_FP8_BACKEND=kernel: this architecture's kernel runs every fp8 GEMM, or nothing does."""
    return os.environ.get(FORCE_ENV) == "kernel"


def choose_backend(
    capability: tuple[int, int], measured: dict[str, list[KernelMeasurement]], device: str, key: BuildKey | None
) -> tuple[str, str]:
    """(backend, reason) for a GPU named `device` of `capability`, before loading: the module docstring's rules, or
    $TRAINFLOW_FP8_BACKEND=kernel, which forces this architecture's kernel (the GPU check's tests)."""
    name = f"sm_{capability[0]}{capability[1]}"
    build = KERNEL_BUILDS.get(capability)
    if build is None:
        return "scaled_mm", f"{name}: kernels/ has no fp8 kernel for it, so torch._scaled_mm (cuBLASLt) runs"
    kernel = f"{build.arch}_kernel"
    if forced():
        return kernel, f"{name}: {build.source}, forced by {FORCE_ENV}=kernel"
    if build.arch == "sm89":
        return kernel, f"{name}: {build.source} (mma.sync fp8, native on Ada, fp32 promotion every 128 of K)"
    if key is None:
        return "scaled_mm", f"{name}: torch._scaled_mm (cuBLASLt), because no build key (CUTLASS headers) here"
    record = measured_record(measured.get(build.arch, []), device, key)
    if record is None:
        seen = sorted({r.device for r in measured.get(build.arch, [])})
        others = f" (it holds {', '.join(seen)}, or other builds)" if seen else ""
        fact = (
            f"kernels/{MEASURED} holds no GPU check of {build.source} on {device} with build key {key.digest()}"
            f"{others} (scripts/gpu_check.sh records one)"
        )
        return "scaled_mm", f"{name}: torch._scaled_mm (cuBLASLt), by measurement: {fact}"
    wins, fact = by_measurement(record, build.source)
    if wins:
        return kernel, f"{name}: {fact}"
    return "scaled_mm", f"{name}: torch._scaled_mm (cuBLASLt), by measurement: {fact}"


def load_backend(device: torch.device, kernel_cache: str | Path = "") -> str:
    """Make fp8_gemm runnable on `device`; which implementation will run there: "reference" (CPU),
    "sm89_kernel", "sm90_kernel" or "scaled_mm". A kernel is loaded from the build cache (`kernel_cache`, else a
    container image's, trainflow.fp8.cache.find_library), never compiled. `backend_reason` says why."""
    return _backend(device, kernel_cache)[0]


def backend_reason(device: torch.device, kernel_cache: str | Path = "") -> str:
    """One line: which fp8_gemm implementation runs on `device`, and the fact that chose it."""
    backend, reason = _backend(device, kernel_cache)
    return f"{backend}: {reason}"


def _backend(device: torch.device, kernel_cache: str | Path) -> tuple[str, str]:
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
    if _LOADED and _LOADED[0][0] != capability:
        raise ConfigError(
            f"fp8_gemm's CUDA implementation is chosen once per process; sm_{capability[0]}"
            f"{capability[1]} is a second GPU architecture here: run one architecture per process"
        )
    if not _LOADED:
        _LOADED.append((capability, _load_cuda(capability, torch.cuda.get_device_name(index), kernel_cache)))
    return _LOADED[0][1]


_LOADED: list[tuple[tuple[int, int], tuple[str, str]]] = []
"""The one CUDA implementation this process registered: (capability, (backend, reason))."""


def _load_cuda(capability: tuple[int, int], device: str, kernel_cache: str | Path) -> tuple[str, str]:
    """Choose, load the chosen kernel's build from the cache (never compile), and register it (or _scaled_mm) as
    fp8_gemm's CUDA implementation. A missing build is one warning, then _scaled_mm at once; where the kernel is
    forced it is one ConfigError naming the cache and the build command instead."""
    build = KERNEL_BUILDS.get(capability)
    name = f"sm_{capability[0]}{capability[1]}"
    try:
        key = kernel_key(build) if build is not None else None
    except (ImportError, OSError) as err:
        if forced():
            raise ConfigError(
                f"{FORCE_ENV}=kernel, but {build.source} has no build key here ({err}): {BUILD_HINT}"
            ) from err
        key = None
        warnings.warn(f"trainflow.fp8: no build key for {build.source} ({err}); torch._scaled_mm runs", stacklevel=5)
    measured = read_measured(kernels_folder())
    backend, reason = choose_backend(capability, measured, device, key)
    if backend != "scaled_mm":
        library, fact = find_library(kernel_cache, key)
        if library is not None:
            torch.ops.load_library(str(library))
            record = measured_record(measured.get(build.arch, []), device, key)
            torch.library.impl(OP, "cuda")(_kernel_op(build, record.per_shape if record else [], device))
            return backend, f"{reason}; loaded {library.parent.name} ({fact})"
        if forced():
            raise ConfigError(
                f"{FORCE_ENV}=kernel, but {fact}: build it with `python -m trainflow.fp8 --arch {build.arch} CACHE` "
                f"(or the build_kernels stage) into that cache, or unset {FORCE_ENV}"
            )
        warnings.warn(f"trainflow.fp8: {fact}; torch._scaled_mm runs the fp8 GEMMs instead: {BUILD_HINT}", stacklevel=5)
        backend, reason = "scaled_mm", f"{name}: torch._scaled_mm (cuBLASLt), because {fact}"
    torch.library.impl(OP, "cuda")(scaled_mm_fp8_gemm)
    return backend, reason


def _kernel_op(build: KernelBuild, timings: list[ShapeTiming], device: str):
    """fp8_gemm's CUDA implementation through `build`'s op (registered by the library just loaded): where the kernel
    has several configurations, per shape the one trainflow.fp8.dispatch chooses, or torch._scaled_mm where that
    measured faster (unless the kernel is forced)."""
    kernel = getattr(torch.ops.trainflow, f"fp8_gemm_{build.arch}").default
    if not build.configs:
        return lambda a, b, scale_a, scale_b, out_dtype: kernel(a, b, scale_a, scale_b, out_dtype)
    sm_count = torch.cuda.get_device_properties(torch.cuda.current_device()).multi_processor_count
    dispatch = ShapeDispatch(timings, device, sm_count=sm_count, scaled_mm=not forced())
    _DISPATCH[:] = [dispatch]

    def run_kernel(a, b, scale_a, scale_b, out_dtype):
        config = dispatch.choose(a.shape[0], b.shape[0], a.shape[1]).config
        if config is None:
            return scaled_mm_fp8_gemm(a, b, scale_a, scale_b, out_dtype)
        return kernel(a, b, scale_a, scale_b, out_dtype, int(config.schedule), config.swizzle)

    return run_kernel


_DISPATCH: list[ShapeDispatch] = []
"""The sm90 kernel's per-shape choices in this process, once it is loaded."""


def shape_choices() -> dict[str, str]:
    """{"MxNxK": "runner: why"} for each shape the sm90 dispatch has run in this process ({} where it has not)."""
    return _DISPATCH[0].choices() if _DISPATCH else {}
