"""Every benchmark's --quick path runs, so none rots unseen (benchmarks/plan_vs_measured.py had, since the summaries
became typed records): a CPU benchmark prints its one JSON object, a GPU one (none here) one line and exit 0.

    .venv/bin/python -m pytest tests/unit/test_benchmarks_quick.py -q

The quick paths are the benchmarks' own, sized to run in seconds: their figures are not the benchmarks' (docs/
benchmarks.md keeps those, each beside its command). The default suite runs the ones under ~9 s and plan_vs_measured
(the one that rotted); the slow suite (-m slow) runs the other nine (SLOW), 107 s of the CI's 25-minute budget. Their
seconds on this 2-core machine at a load of 2.5-4, 2026-12-04/05: plan_vs_measured 25-36 (two spawned 2-rank probes,
then 2 ranks training through the real launcher), compile 20 (a cold inductor build of a block's forward and
backward: 13 C++ kernels of ~1 s of g++ each), checkpoint_load 13-19 (its 4 ranks' starts; it saves in its load
world, where a world per save took 50-60 s), overhead 14, pipeline_bubble 11-12 (m=4 only), hf_import 10-12,
cp_memory 9-12, checkpoint 8-11, dp_memory 10-11, tokenize_shards 10-11 (2 MB of text), grad_buckets 9-10,
activation_memory 6-7, stage 3 and the GPU ones' one line 2-3 each. A spawned process's start and exit (torch's
import, ~3 s of CPU) is most of a multi-rank one's seconds, so those quick paths run fewer ranks or fewer worlds of
them.
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
SLOW = {
    "checkpoint_load.py",
    "compile.py",
    "cp_memory.py",
    "dp_memory.py",
    "grad_buckets.py",
    "hf_import.py",
    "overhead.py",
    "pipeline_bubble.py",
    "tokenize_shards.py",
}
"""Quick paths of 9-20 s each here, run with -m slow."""


def test_every_benchmark_is_listed():
    assert len(BENCHMARKS) >= 15 and GPU <= set(BENCHMARKS) and SLOW <= set(BENCHMARKS), BENCHMARKS


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
