"""Every benchmark's --quick path runs, so none rots unseen (benchmarks/plan_vs_measured.py had, since the summaries
became typed records): a CPU benchmark prints its one JSON object, a GPU one (none here) one line and exit 0.

    .venv/bin/python -m pytest tests/unit/test_benchmarks_quick.py -q

The quick paths are the benchmarks' own, sized to run in seconds: their figures are not the benchmarks' (docs/
benchmarks.md keeps those, each beside its command). Those whose quick path still takes over 20 s on this 2-core machine
(its seconds at a load of 2-5, 2026-12-04, beside each) are marked slow, so the default suite's share stays near a
minute (64 s for the other seven); `-m slow` runs them.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
import torch

from tests.conftest import REPO

BENCHMARKS = sorted(p.name for p in (REPO / "benchmarks").glob("*.py") if not p.name.startswith("_"))
GPU = {"fp8_gemm.py", "gpu_step.py"}  # need CUDA; elsewhere one line and exit 0
SLOW = {  # --quick's seconds here: each spawns ranks, trains or writes hundreds of MB
    "checkpoint.py": 71,
    "dp_memory.py": 53,
    "grad_buckets.py": 48,
    "checkpoint_load.py": 47,
    "plan_vs_measured.py": 39,
    "compile.py": 37,
    "hf_import.py": 32,
    "activation_memory.py": 28,
    "cp_memory.py": 23,
}


def test_every_benchmark_is_listed():
    assert len(BENCHMARKS) >= 15 and GPU | set(SLOW) <= set(BENCHMARKS), BENCHMARKS


@pytest.mark.parametrize("name", [pytest.param(n, marks=pytest.mark.slow) if n in SLOW else n for n in BENCHMARKS])
def test_the_quick_path_runs(name, tmp_path):
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO / "src"), *sys.path]), "TMPDIR": str(tmp_path)}
    done = subprocess.run(
        [sys.executable, str(REPO / "benchmarks" / name), "--quick"],
        capture_output=True,
        text=True,
        cwd=REPO / "benchmarks",
        env=env,
        timeout=300,
    )
    assert done.returncode == 0, f"{name} --quick exited {done.returncode}:\n{done.stderr[-3000:]}"
    if name in GPU and not torch.cuda.is_available():
        line = done.stdout.strip()
        assert "\n" not in line and line.startswith(f"{name[:-3]}: ") and "nothing measured" in line, done.stdout
        return
    result = json.loads(done.stdout)
    assert result["benchmark"] == name.removesuffix(".py"), f"{name} printed {done.stdout[:300]}"
