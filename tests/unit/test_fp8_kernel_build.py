"""kernels/fp8_gemm.cu compiles with nvcc for Hopper (sm_90a) and Ada (sm_89), warnings as errors, so the kernel
cannot rot on machines that cannot run it (torch here may be a CPU build: the .cu needs only CUDA headers).
Skipped, with the reason, where nvcc is absent. About 9 s + 5 s on the 2-core development machine."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

from tests.conftest import REPO

SOURCE = REPO / "kernels/fp8_gemm.cu"


def find_nvcc() -> Path | None:
    """nvcc from PATH, else $CUDA_HOME/bin, else /usr/local/cuda/bin."""
    candidates = [shutil.which("nvcc")]
    if home := os.environ.get("CUDA_HOME"):
        candidates.append(str(Path(home) / "bin/nvcc"))
    candidates.append("/usr/local/cuda/bin/nvcc")
    return next((Path(c) for c in candidates if c and Path(c).is_file()), None)


NVCC = find_nvcc()


@pytest.mark.skipif(NVCC is None, reason="nvcc not found on PATH, in $CUDA_HOME/bin or /usr/local/cuda/bin")
@pytest.mark.parametrize("arch", ["sm_90a", "sm_89"])
def test_kernel_compiles(arch, tmp_path):
    out = tmp_path / f"fp8_gemm_{arch}.o"
    flags = [f"-arch={arch}", "-O3", "-std=c++17", "-Werror", "all-warnings"]
    cmd = [str(NVCC), *flags, "-c", str(SOURCE), "-o", str(out)]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, f"{' '.join(cmd)} failed:\n{done.stdout}{done.stderr}"
    assert out.stat().st_size > 0
