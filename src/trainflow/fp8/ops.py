"""The torch op trainflow::fp8_gemm: its schema, its reference (CPU) implementation, its fake, and which CUDA
implementation runs it, chosen by measured fact.

    python -m trainflow.fp8        # on a GPU node: build the kernel of the visible GPU's architecture

fp8_gemm(a, b, scale_a, scale_b, out_dtype) = diag(scale_a) (a b^T) diag(scale_b) in out_dtype, with a (M, K)
e4m3 or e5m2, b (N, K) e4m3 (a Linear weight's layout), each scale one fp32 value or one per row of its operand
(dequantisation multipliers: 1 / the quantisation scale), out_dtype float32 or bfloat16.

The layout is pytorch/extension-cpp's: the schema is declared here, once; the CPU implementation is plain
PyTorch and doubles as the test oracle; `register_fake` lets torch.compile trace the op. The CUDA
implementation is chosen per compute capability by `load_backend`, and `backend_reason` says why in one line:
- sm_89 (Ada): kernels/fp8_gemm.cu (mma.sync, fp32 promotion every 128 of K), op trainflow::fp8_gemm_sm89.
- sm_90 (Hopper): kernels/fp8_gemm_sm90.cu (CUTLASS wgmma + TMA), op trainflow::fp8_gemm_sm90, only once
  kernels/measured.json records a GPU check of these very sources (their SHA-256) that passed and was no slower
  than torch._scaled_mm over the benchmark's shapes; until then torch._scaled_mm (cuBLASLt). Never the mma.sync
  kernel: Hopper has no fp8 mma.sync, nvcc emulates it with fp16 HMMA (kernels/README.md).
- anything else, or a kernel whose build failed (one warning naming the failure): torch._scaled_mm.
Nothing falls back to bf16 silently.

Why the reference is exact up to summation order: fp8 -> fp32 is exact, and a product of two fp8 values has at
most 4 + 4 significant bits and an exponent far inside fp32's range, so it is exact in fp32 as the tensor
cores form it; the fp32 sums differ from the kernel's only in their order. The scales are applied after the
sums, as the kernels' epilogues do.
"""

from __future__ import annotations

import functools
import hashlib
import importlib.util
import json
import warnings
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.nn.functional as F

from trainflow.errors import ConfigError

OP = "trainflow::fp8_gemm"
SCHEMA = "(Tensor a, Tensor b, Tensor scale_a, Tensor scale_b, ScalarType out_dtype) -> Tensor"
KERNELS = Path(__file__).resolve().parents[3] / "kernels"
MEASURED = KERNELS / "measured.json"
EXTENSION = "trainflow_fp8"  # one extension per architecture: trainflow_fp8_sm89, trainflow_fp8_sm90
BUILD_HINT = "build it on a GPU node with `python -m trainflow.fp8` (needs nvcc and CUDA_HOME; kernels/README.md)"
A_DTYPES = (torch.float8_e4m3fn, torch.float8_e5m2)
OUT_DTYPES = (torch.float32, torch.bfloat16)
SCALED_MM_MULTIPLE = 16  # cuBLASLt's fp8 GEMM wants every dimension a multiple of 16
MMA_K = 32  # K of one fp8 tensor-core instruction (mma.sync m16n8k32, wgmma m64nNk32)
PROMOTE_K = 128  # both kernels add the tensor core's partial sums into fp32 at least every 128 of K
TENSOR_CORE_UNIT = 2.0**-13  # its fp8 accumulator keeps ~13 mantissa bits (SageAttention on Ada; ~14: DeepGEMM)


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
        return [KERNELS / self.source, KERNELS / "fp8_binding.cpp"]


KERNEL_BUILDS = {
    (8, 9): KernelBuild("sm89", "fp8_gemm.cu", "arch=compute_89,code=sm_89", cutlass=False),
    (9, 0): KernelBuild("sm90", "fp8_gemm_sm90.cu", "arch=compute_90a,code=sm_90a", cutlass=True),
}

for _name in (OP, *(b.op for b in KERNEL_BUILDS.values())):
    torch.library.define(_name, SCHEMA)


def fp8_gemm(
    a: torch.Tensor, b: torch.Tensor, scale_a: torch.Tensor, scale_b: torch.Tensor, out_dtype: torch.dtype
) -> torch.Tensor:
    """diag(scale_a) (a b^T) diag(scale_b) in out_dtype; see the module docstring."""
    return torch.ops.trainflow.fp8_gemm(a, b, scale_a, scale_b, out_dtype)


def _check(a: torch.Tensor, b: torch.Tensor, scale_a: torch.Tensor, scale_b: torch.Tensor, out_dtype: torch.dtype):
    torch._check(a.dim() == 2 and b.dim() == 2, lambda: f"fp8_gemm: a and b must be 2-D, got {a.shape}, {b.shape}")
    torch._check(a.shape[1] == b.shape[1], lambda: f"fp8_gemm: a {tuple(a.shape)} and b {tuple(b.shape)} differ in K")
    torch._check(a.dtype in A_DTYPES, lambda: f"fp8_gemm: a must be float8_e4m3fn or float8_e5m2, got {a.dtype}")
    torch._check(b.dtype == torch.float8_e4m3fn, lambda: f"fp8_gemm: b must be float8_e4m3fn, got {b.dtype}")
    torch._check(out_dtype in OUT_DTYPES, lambda: f"fp8_gemm: out_dtype must be float32 or bfloat16, got {out_dtype}")
    _check_scale("scale_a", scale_a, a.shape[0])
    _check_scale("scale_b", scale_b, b.shape[0])


def _check_scale(name: str, scale: torch.Tensor, rows: int) -> None:
    torch._check(scale.dtype == torch.float32, lambda: f"fp8_gemm: {name} must be float32, got {scale.dtype}")
    torch._check(
        scale.numel() == 1 or scale.numel() == rows,
        lambda: f"fp8_gemm: {name} has {scale.numel()} values; it needs 1 (per tensor) or {rows} (per row)",
    )


def reference_fp8_gemm(
    a: torch.Tensor, b: torch.Tensor, scale_a: torch.Tensor, scale_b: torch.Tensor, out_dtype: torch.dtype
) -> torch.Tensor:
    """The oracle: exact fp32 products, fp32 sums, scales applied to the sums."""
    _check(a, b, scale_a, scale_b, out_dtype)
    # A Python kernel's ops dispatch afresh: under an enclosing autocast this matmul would run in bf16.
    with torch.autocast(a.device.type, enabled=False):
        acc = a.float() @ b.float().t()  # (M, N)
    return (acc * scale_a.reshape(-1, 1) * scale_b.reshape(1, -1)).to(out_dtype)


def fake_fp8_gemm(
    a: torch.Tensor, b: torch.Tensor, scale_a: torch.Tensor, scale_b: torch.Tensor, out_dtype: torch.dtype
) -> torch.Tensor:
    _check(a, b, scale_a, scale_b, out_dtype)
    return a.new_empty((a.shape[0], b.shape[0]), dtype=out_dtype)


torch.library.impl(OP, "cpu")(reference_fp8_gemm)
torch.library.register_fake(OP)(fake_fp8_gemm)


def error_bound(
    a: torch.Tensor, b: torch.Tensor, scale_a: torch.Tensor, scale_b: torch.Tensor, exact: torch.Tensor, out_dtype
) -> torch.Tensor:
    """(M, N) float64: how far fp8_gemm may be from `exact` (the fp64 result) with fp32 promotion every PROMOTE_K.

    Within a slice of PROMOTE_K, the tensor core's partial sum passes PROMOTE_K / MMA_K = 4 instructions, each
    allowed 2 units of TENSOR_CORE_UNIT of the slice's sum of |a b| (one for its own sum of 32 products, one for
    the add into the partial): 8 * 2^-13 of sum |a b| over all slices, since each slice counts its |a b| once.
    The fp32 promotions and the two scale multiplications add (K / PROMOTE_K + 3) * 2^-24 of it; a bf16 output
    one rounding, 2^-8 of the value. Accumulating the whole K in the tensor core instead truncates a running sum
    that grows to sum |a b| on same-sign data at each of K / MMA_K instructions: at K = 8192, 40-50 units with
    13 bits and 20-24 with 14 in the emulation of tests/gpu/test_fp8_kernel.py, 5x and 2.5x this bound.
    """
    magnitude = (a.double().abs() @ b.double().abs().t()) * scale_a.double().abs().reshape(-1, 1)
    magnitude = magnitude * scale_b.double().abs().reshape(1, -1)  # (M, N)
    k = a.shape[1]
    units = 2 * (PROMOTE_K // MMA_K) * TENSOR_CORE_UNIT + (-(-k // PROMOTE_K) + 3) * 2.0**-24
    bound = units * magnitude
    return bound + 2.0**-8 * (exact.abs() + bound) if out_dtype == torch.bfloat16 else bound


def _pad_to_multiple(q: torch.Tensor, multiple: int) -> torch.Tensor:
    """q (rows, cols) with zero rows and columns appended up to multiples of `multiple` (byte 0 is +0.0 in fp8)."""
    rows, cols = -q.shape[0] % multiple, -q.shape[1] % multiple
    if rows == 0 and cols == 0:
        return q
    # F.pad has no fp8 kernels; the bytes pad as uint8.
    return F.pad(q.view(torch.uint8), (0, cols, 0, rows)).view(q.dtype)


def scaled_mm_fp8_gemm(
    a: torch.Tensor, b: torch.Tensor, scale_a: torch.Tensor, scale_b: torch.Tensor, out_dtype: torch.dtype
) -> torch.Tensor:
    """fp8_gemm through torch._scaled_mm (cuBLASLt): the CUDA implementation wherever no kernel of ours is chosen.

    _scaled_mm wants dimensions in multiples of 16, so odd sizes are padded with zeros (which add nothing to the
    sums) and the result cut back. Per-tensor scales go to cuBLASLt; per-row ones are applied afterwards in fp32.
    """
    _check(a, b, scale_a, scale_b, out_dtype)
    m, n = a.shape[0], b.shape[0]
    if a.shape[1] == 0:  # empty sums are 0; cuBLASLt is not asked about K = 0
        return a.new_zeros((m, n), dtype=out_dtype)
    a_p, b_p = (
        _pad_to_multiple(a.contiguous(), SCALED_MM_MULTIPLE),
        _pad_to_multiple(b.contiguous(), SCALED_MM_MULTIPLE),
    )
    if scale_a.numel() == 1 and scale_b.numel() == 1:
        out = torch._scaled_mm(a_p, b_p.t(), scale_a.reshape(()), scale_b.reshape(()), out_dtype=out_dtype)
        return out[:m, :n]
    one = torch.ones((), device=a.device)
    acc = torch._scaled_mm(a_p, b_p.t(), one, one, out_dtype=torch.float32)[:m, :n]
    return (acc * scale_a.reshape(-1, 1) * scale_b.reshape(1, -1)).to(out_dtype)


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
        extra_include_paths=[str(KERNELS)],
        extra_cflags=["-O3", f"-D{build.define}"],
        extra_cuda_cflags=nvcc_flags(build),
        is_python_module=False,
        verbose=verbose,
    )
    return build


def kernel_sha256(build: KernelBuild) -> str:
    """SHA-256 of the files that make `build`'s kernel: a measurement holds for these bytes only."""
    digest = hashlib.sha256()
    for path in [*build.sources(), KERNELS / "fp8_gemm.h"]:
        digest.update(path.read_bytes())
    return digest.hexdigest()


def measured_faster(record: dict | None, build: KernelBuild) -> tuple[bool, str]:
    """Whether kernels/measured.json's `record` for `build` shows the kernel correct and no slower than
    torch._scaled_mm on these sources; and the fact, in words. Records come from benchmarks/fp8_gemm.py's
    "measured" ({arch: record}), which scripts/gpu_check.sh writes out as measured.json."""
    if not record:
        return False, f"kernels/{MEASURED.name} holds no GPU check of {build.source} (scripts/gpu_check.sh records one)"
    if record.get("kernel_sha256") != kernel_sha256(build):
        return False, f"kernels/{MEASURED.name} measured other sources than today's {build.source} (SHA-256 differs)"
    if not record.get("correctness_passed"):
        return False, f"{build.source} failed its GPU check against the reference ({record.get('device')})"
    kernel_s, scaled_mm_s = record["seconds"]["kernel"], record["seconds"]["scaled_mm"]
    ratio = scaled_mm_s / kernel_s
    fact = f"{ratio:.3f}x torch._scaled_mm's speed over the benchmark's shapes on {record.get('device')}"
    return kernel_s <= scaled_mm_s, f"{build.source} measured at {fact}"


def choose_backend(capability: tuple[int, int], measured: dict) -> tuple[str, str]:
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


def read_measured() -> dict:
    """kernels/measured.json: {arch: the record of its last GPU check}; {} while nothing has been measured."""
    return json.loads(MEASURED.read_text()) if MEASURED.is_file() else {}


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
