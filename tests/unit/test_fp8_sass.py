"""Compile-level proof of kernels/, no GPU needed: each kernel builds for its architecture with warnings as errors,
the binding compiles for both, and the machine code holds the instructions each claim rests on.

    .venv/bin/python -m pytest -m slow tests/unit/test_fp8_sass.py -q -rs

Slow (CI time): its builds are the default suite's longest setup, 119 s of wall on the CI-like 2-core machine; the GPU
check's sass step (scripts/gpu_check.sh) checks the device's own build with the same trainflow.fp8.sass rules, and
tests/unit/test_fp8_sass_check.py (those rules on recorded SASS) and test_fp8_fused.py (the Triton casts' code) stay
in the default suite.

The builds use the flags the extension is built with (trainflow.fp8.kernels.nvcc_flags, plus torch's own nvcc
flags), once per session and in parallel (fixture `builds`); `cuobjdump --dump-sass` (the pinned
nvidia-cuda-cuobjdump and nvidia-cuda-nvdisasm wheels) disassembles them. What each assertion proves:
- sm_90a, kernels/fp8_gemm_sm90*.cu (the build compiles its seven translation units in parallel; here they are
  included into one, so the CUTLASS headers are parsed once on this 2-core machine: the same kernels, the same
  flags): its 12 kernels, 4 (A e4m3 / e5m2 x C fp32 / bf16) in each configuration
  (cooperative, ping-pong, stream-K), checked by trainflow.fp8.sass as the GPU check checks its build: every
  kernel issues QGMMA (wgmma, Hopper's warpgroup MMA, on fp8 operands: E4M3.E4M3, and E5M2.E4M3 for gradients)
  and no HMMA or fp8-to-fp16 F2FP unpacking (the emulation nvcc makes of fp8 mma.sync on Hopper); at least one
  FADD per fp32 accumulator (the promotions of the partial sums; a whole-K accumulation has none); ptxas did not
  serialise the wgmmas (its warning C7510) and spilled nothing to local memory (its -v report).
- sm_89, kernels/fp8_gemm.cu: QMMA.16832 on E4M3.E4M3 and E5M2.E4M3, no HMMA, no F2FP unpacking, and the
  promotion's FADDs (none before it was added).
- the binding (kernels/fp8_binding.cpp) passes g++ -fsyntax-only -Wall -Wextra -Werror for both architectures,
  against the torch headers here (a CPU build lacks one generated CUDA header, stubbed as CUDA builds write it).
Skipped, with the reason, where nvcc, the cuobjdump wheel, the CUTLASS wheel or g++ is missing. 178 s of CPU on
the 2-core development machine, nearly all of it the CUTLASS build (138 s of CPU, one translation unit of 12
kernels; 75 s with one configuration's 4), 500 s of wall while a full suite beside it kept the load at 12-20 (with
one configuration: 60-66 s of CPU, 75 s and 108 s of wall at loads of 4 and 10).
"""

from __future__ import annotations

import importlib.util
import os
import re
import shutil
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

import pytest
from torch.utils.cpp_extension import COMMON_NVCC_FLAGS, include_paths

from trainflow.fp8 import sass as sass_check
from trainflow.fp8.kernels import KERNEL_BUILDS, kernels_folder, nvcc_flags

SM89, SM90 = KERNEL_BUILDS[(8, 9)], KERNEL_BUILDS[(9, 0)]
# fp32 accumulators per thread in both kernels: a warpgroup's 64x128 of C over 128 threads (sm90), a warp's 64x32
# over 32 threads (sm89); each promotion adds every one of them once.
ACCUMULATORS_PER_THREAD = 64
WERROR = ["-Werror", "all-warnings"]


def find_nvcc() -> Path | None:
    """nvcc from PATH, else $CUDA_HOME/bin, else /usr/local/cuda/bin."""
    candidates = [shutil.which("nvcc")]
    if home := os.environ.get("CUDA_HOME"):
        candidates.append(str(Path(home) / "bin/nvcc"))
    candidates.append("/usr/local/cuda/bin/nvcc")
    return next((Path(c) for c in candidates if c and Path(c).is_file()), None)


def find_cuobjdump() -> Path | None:
    """The nvidia-cuda-cuobjdump wheel's binary (it runs the nvidia-cuda-nvdisasm wheel's beside it)."""
    spec = importlib.util.find_spec("nvidia")
    for root in spec.submodule_search_locations if spec else []:
        if (path := Path(root) / "cu13/bin/cuobjdump").is_file() and (path.parent / "nvdisasm").is_file():
            return path
    return None


def cuda_include(nvcc: Path) -> Path | None:
    """The CUDA toolkit's include folder (nvcc may be a wrapper script outside the toolkit)."""
    roots = [nvcc.resolve().parents[1], *([Path(os.environ["CUDA_HOME"])] if "CUDA_HOME" in os.environ else [])]
    return next(
        (r / "include" for r in [*roots, Path("/usr/local/cuda")] if (r / "include/cuda_runtime_api.h").is_file()), None
    )


NVCC, CUOBJDUMP, GXX = find_nvcc(), find_cuobjdump(), shutil.which("g++")
HAS_CUTLASS = importlib.util.find_spec("cutlass_library") is not None
pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(NVCC is None, reason="nvcc not found on PATH, in $CUDA_HOME/bin or /usr/local/cuda/bin"),
    pytest.mark.skipif(CUOBJDUMP is None, reason="the nvidia-cuda-cuobjdump/nvdisasm wheels are not installed"),
    pytest.mark.skipif(not HAS_CUTLASS, reason="the nvidia-cutlass wheel (CUTLASS headers) is not installed"),
]


@dataclass
class Build:
    cmd: list[str]
    returncode: int
    log: str
    seconds: float
    output: Path | None  # the object file, for the nvcc builds

    def explain(self) -> str:
        return f"{' '.join(self.cmd)} exited {self.returncode}:\n{self.log}"


def unit_of(build, tmp: Path) -> Path:
    """The one file nvcc compiles for `build`: its source, or, where it has more translation units, one that includes
    them all (each compiles alone in the extension's build; the GPU check builds them so)."""
    if not build.units:
        return kernels_folder() / build.source
    unity = tmp / f"{build.arch}_units.cu"
    unity.write_text("".join(f'#include "{unit}"\n' for unit in build.kernel_units()))
    return unity


def nvcc_command(build, unit: Path, out: Path) -> list[str]:
    return [
        str(NVCC),
        *COMMON_NVCC_FLAGS,
        *nvcc_flags(build),
        *WERROR,
        *(["-Xptxas", "-v"] if build.cutlass else []),  # registers and spills per kernel, into the log
        "-I",
        str(kernels_folder()),
        "-c",
        str(unit),
        "-o",
        str(out),
    ]


def binding_command(build, stub: Path) -> list[str]:
    torch_includes = [f for p in include_paths() for f in ("-isystem", p)]
    cuda = ["-isystem", str(cuda_include(NVCC))] if cuda_include(NVCC) else []
    flags = ["-std=c++17", "-fsyntax-only", "-Wall", "-Wextra", "-Werror", f"-D{build.define}"]
    return [
        GXX,
        *flags,
        "-isystem",
        str(stub),
        *torch_includes,
        *cuda,
        "-I",
        str(kernels_folder()),
        str(kernels_folder() / "fp8_binding.cpp"),
    ]


@pytest.fixture(scope="session")
def builds(tmp_path_factory) -> dict[str, Build]:
    """Every compile of this module, started at once and awaited: 'sm89', 'sm90' (nvcc), 'binding_sm89/90' (g++)."""
    tmp = tmp_path_factory.mktemp("fp8_kernels")
    stub = tmp / "stub"  # c10/cuda/impl/cuda_cmake_macros.h is generated by CUDA builds of torch only
    (stub / "c10/cuda/impl").mkdir(parents=True)
    (stub / "c10/cuda/impl/cuda_cmake_macros.h").write_text("#define C10_CUDA_BUILD_SHARED_LIBS\n")
    commands = {
        b.arch: (nvcc_command(b, unit_of(b, tmp), tmp / f"{b.arch}.o"), tmp / f"{b.arch}.o") for b in (SM89, SM90)
    }
    if GXX:
        commands |= {f"binding_{b.arch}": (binding_command(b, stub), None) for b in (SM89, SM90)}
    started = {
        name: (subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True), time.monotonic())
        for name, (cmd, _) in commands.items()
    }
    done = {}
    for name, (proc, t0) in started.items():
        log, _ = proc.communicate(timeout=600)
        done[name] = Build(commands[name][0], proc.returncode, log, time.monotonic() - t0, commands[name][1])
    return done


def dump_sass(build: Build) -> str:
    return subprocess.run(
        [str(CUOBJDUMP), "--dump-sass", str(build.output)], capture_output=True, text=True, check=True
    ).stdout


def sass_functions(build: Build) -> dict[str, str]:
    """The build's SASS by kernel (mangled name -> its instructions)."""
    return sass_check.functions(dump_sass(build))


def count(opcode: str, sass: str) -> int:
    """Instructions whose opcode starts with `opcode` (e.g. 'QGMMA.64x128x32.F32.E4M3.E4M3', 'FADD')."""
    return len(re.findall(rf"^\s*/\*[0-9a-f]+\*/\s+(?:@!?U?P\w+\s+)?{re.escape(opcode)}[\s.]", sass, flags=re.M))


@pytest.mark.parametrize("arch", ["sm89", "sm90"])
def test_kernel_builds_with_warnings_as_errors(builds, arch):
    build = builds[arch]
    assert build.returncode == 0, build.explain()
    assert "C7510" not in build.log, f"ptxas serialised wgmma (a call inside the mainloop):\n{build.log}"
    assert build.output.stat().st_size > 0


@pytest.mark.skipif(GXX is None, reason="g++ not found on PATH")
@pytest.mark.parametrize("arch", ["sm89", "sm90"])
def test_binding_compiles_for_each_architecture(builds, arch):
    assert builds[f"binding_{arch}"].returncode == 0, builds[f"binding_{arch}"].explain()


def test_sm90_kernels_run_fp8_wgmma_with_promotion_in_every_configuration(builds):
    text = dump_sass(builds["sm90"])
    kernels, found = sass_check.functions(text), sass_check.counts(text, "sm90")
    configs = sorted(sass_check.config_of(name, "sm90") for name in found)
    assert configs == sorted(sass_check.CONFIGS["sm90"] * 4), f"4 kernels per configuration, got {configs}"
    assert sass_check.faults(found, "sm90") == [], found
    for name, c in found.items():  # the wgmma shape both tiles use: m64 per warpgroup, n128
        assert count("QGMMA.64x128x32.F32", kernels[name]) == c["QGMMA.E4M3.E4M3"] + c["QGMMA.E5M2.E4M3"], name


def test_sm90_kernels_keep_their_accumulators_in_registers(builds):
    spills = re.findall(r"(\d+) bytes spill stores, (\d+) bytes spill loads", builds["sm90"].log)
    assert len(spills) >= 12 and set(spills) == {("0", "0")}, builds["sm90"].log


def test_sm89_kernels_run_native_fp8_mma_sync_with_promotion(builds):
    kernels = sass_functions(builds["sm89"])
    assert len(kernels) == 4, f"one kernel per A dtype x output dtype, got {list(kernels)}"
    operands = {"E4M3.E4M3": 0, "E5M2.E4M3": 0}
    for name, sass in kernels.items():
        for pair in operands:
            operands[pair] += count(f"QMMA.16832.F32.{pair}", sass)
        assert count("HMMA", sass) == 0 and not re.search(r"F2FP\.F16\.E[45]M[23]", sass), f"{name}: fp16 emulation"
        assert count("FADD", sass) >= ACCUMULATORS_PER_THREAD, f"{name}: no fp32 promotion of the partial sums"
    assert operands["E4M3.E4M3"] > 0 and operands["E5M2.E4M3"] > 0, operands
