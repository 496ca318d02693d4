"""scripts/gpu_check.sh without a GPU: --dry-run lists every step with its budget, the budgets sum to under 6
minutes, and a carried wheel missing stops both the dry run and the real one at once, in one line naming it."""

from __future__ import annotations

import re
import subprocess

import pytest

from tests.conftest import REPO

SCRIPT = REPO / "scripts/gpu_check.sh"
CARRIED = [
    "hydra_core-1.3.2-py3-none-any.whl",
    "omegaconf-2.3.0-py3-none-any.whl",
    "antlr4_python3_runtime-4.9.3-py3-none-any.whl",
    "submitit-1.5.3-py3-none-any.whl",
    "nvidia_cutlass-4.2.0.0-py3-none-any.whl",
    "crc32c-2.7.1-cp312-cp312-manylinux_2_17_x86_64.whl",
    "zstandard-0.25.0-cp312-cp312-manylinux_2_17_x86_64.whl",
]


def gpu_check(tmp_path, *args: str, wheels: list[str]) -> subprocess.CompletedProcess:
    folder = tmp_path / "whl"
    folder.mkdir(exist_ok=True)
    for name in wheels:
        (folder / name).write_bytes(b"")
    env = {"PATH": "/usr/bin:/bin", "WHEELS": str(folder), "HOME": str(tmp_path)}
    return subprocess.run(["bash", str(SCRIPT), *args], capture_output=True, text=True, env=env, timeout=60)


def test_the_dry_run_lists_every_step_with_a_budget_summing_under_6_minutes(tmp_path):
    result = gpu_check(tmp_path, "--dry-run", wheels=CARRIED)
    assert result.returncode == 0, result.stdout + result.stderr
    steps = re.findall(r"^(\w+)\s+(\d+) s  \S", result.stdout, re.M)
    assert [name for name, _ in steps] == [
        "wheels", "environment", "build", "sass", "tests_gpu", "fp8_gemm", "train_steps", "power",
    ]  # fmt: skip
    total = sum(int(budget) for _, budget in steps)
    assert total < 360 and f"total: {total} s of the 360 s allowed" in result.stdout


@pytest.mark.parametrize("args", [("--dry-run",), ("out",)])
def test_a_missing_carried_wheel_stops_at_once_naming_it(tmp_path, args):
    result = gpu_check(tmp_path, *args, wheels=[w for w in CARRIED if not w.startswith("nvidia_cutlass")])
    lines = [line for line in (result.stdout + result.stderr).splitlines() if "missing" in line]
    assert result.returncode == 2 and len(lines) == 1, result.stdout + result.stderr
    assert lines[0].split(": ", 2)[2].startswith("nvidia-cutlass (run bash scripts/gpu_check.sh --prepare")
    assert not (tmp_path / "out").exists()  # nothing started
