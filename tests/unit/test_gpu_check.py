"""scripts/gpu_check.sh without a GPU: --dry-run lists every step with its budget (at most 300 s in all); a carried
wheel missing stops the dry run and the real one at once, in one line naming it; and --stand-in runs the real runner
with every GPU step replaced by a stand-in of the same shape (scripts/gpu_check_steps/stand_in.py), so what is tested
here is the runner itself: steps that are shell functions run under timeout, a step over its budget is killed and
recorded (exit 124) while the next ones run, every result is merged into gpu_check.json, the evidence of a failing
test (its traceback and output) is kept in at most 8 files, and --steps reruns only the named steps against the kept
build and merges them with the other steps' last results.

    .venv/bin/python -m pytest tests/unit/test_gpu_check.py -q
"""

from __future__ import annotations

import json
import re
import subprocess
import sys

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
STEPS = ["wheels", "environment", "build", "sass", "tests_gpu", "fp8_gemm", "train_steps", "power", "dvfs"]


def gpu_check(tmp_path, *args: str, wheels: list[str] = CARRIED, **env: str) -> subprocess.CompletedProcess:
    folder = tmp_path / "whl"
    folder.mkdir(exist_ok=True)
    for name in wheels:
        (folder / name).write_bytes(b"")
    env = {
        "PATH": "/usr/bin:/bin",
        "WHEELS": str(folder),
        "HOME": str(tmp_path),
        "PYTHON": sys.executable,
        "GPU_CHECK_KEEP": str(tmp_path / "keep"),
        **env,
    }
    return subprocess.run(["bash", str(SCRIPT), *args], capture_output=True, text=True, env=env, timeout=120)


def test_the_dry_run_lists_every_step_with_a_budget_summing_to_at_most_300_s(tmp_path):
    result = gpu_check(tmp_path, "--dry-run")
    assert result.returncode == 0, result.stdout + result.stderr
    steps = re.findall(r"^(\w+)\s+(\d+) s  \S", result.stdout, re.M)
    assert [name for name, _ in steps] == STEPS, result.stdout
    total = sum(int(budget) for _, budget in steps)
    assert total <= 300 and f"total: {total} s of the 300 s allowed" in result.stdout, result.stdout


@pytest.mark.parametrize("args", [("--dry-run",), ("out",)])
def test_a_missing_carried_wheel_stops_at_once_naming_it(tmp_path, args):
    result = gpu_check(tmp_path, *args, wheels=[w for w in CARRIED if not w.startswith("nvidia_cutlass")])
    lines = [line for line in (result.stdout + result.stderr).splitlines() if "missing" in line]
    assert result.returncode == 2 and len(lines) == 1, result.stdout + result.stderr
    assert lines[0].split(": ", 2)[2].startswith("nvidia-cutlass (run bash scripts/gpu_check.sh --prepare")
    assert not (tmp_path / "out").exists()  # nothing started


def test_an_unknown_step_is_one_line_naming_the_steps(tmp_path):
    result = gpu_check(tmp_path, "--stand-in", "--steps", "sass,tets_gpu", str(tmp_path / "out"))
    assert result.returncode == 2 and result.stdout.count("\n") == 1, result.stdout + result.stderr
    assert "no step 'tets_gpu' (steps: wheels,environment,build," in result.stdout


@pytest.fixture(scope="module")
def stand_in(tmp_path_factory):
    """One whole stand-in run, the power step hanging past a budget lowered to 1 s; then a --steps rerun of power
    and sass (the hang gone) into another folder: (the first run, the rerun, their folders)."""
    tmp = tmp_path_factory.mktemp("gpu_check")
    first = gpu_check(tmp, "--stand-in", str(tmp / "out"), GPU_CHECK_STAND_IN="power=hang", GPU_CHECK_BUDGET_power="1")
    again = gpu_check(tmp, "--stand-in", "--steps", "power,sass", str(tmp / "again"))
    return first, again, tmp


def results(folder) -> dict:
    return json.loads((folder / "gpu_check.json").read_text())


def test_every_step_runs_under_its_budget_and_is_merged(stand_in):
    first, _, tmp = stand_in
    found = results(tmp / "out")
    exits = {s["step"]: s["exit"] for s in found["steps"]}
    assert first.returncode == 1 and not found["passed"], first.stdout + first.stderr
    # wheels is a shell function; tests_gpu's stand-in has one failing test; power hung past its 1 s: killed (124).
    assert exits == dict.fromkeys(STEPS, 0) | {"tests_gpu": 1, "power": 124}, exits
    # whole seconds by the clock: a 1 s budget ends 1 or 2 clock seconds after its start
    assert re.search(r"^== power: exit 124 after [12] s: over its budget$", first.stdout, re.M), first.stdout
    assert found["tests_gpu"]["tests"] == 2 and found["tests_gpu"]["failures"] == 1, found["tests_gpu"]
    assert found["dvfs"]["allowed"] and [p["locked_mhz"] for p in found["dvfs"]["points"]] == [495, 1980, None]
    assert found["sass"]["found"], found["sass"]  # the build step's folder, found by the runner for sass


def test_the_evidence_of_a_failing_test_is_kept_in_at_most_8_files(stand_in):
    _, _, tmp = stand_in
    out = tmp / "out"
    files = sorted(p.name for p in out.rglob("*") if p.is_file())
    assert len(files) <= 8 and {"gpu_check.json", "gpu_check.log", "tests_gpu.txt", "tests_gpu.xml"} <= set(files)
    report = (out / "tests_gpu.txt").read_text()
    assert "stand-in output to keep: {'backend': 'stand-in'" in report, report  # the failing test's own output
    assert "AssertionError: the loss did not fall: [5.5, 5.6]" in report and "PASSED" in report, report
    failed = results(out)["tests_gpu"]["failed"]
    assert list(failed.values()) == [["AssertionError: the loss did not fall: [5.5, 5.6]"]], failed
    assert all(f"== {step}: exit" in (out / "steps.out").read_text() for step in STEPS)
    measured = json.loads((out / "measured.json").read_text())  # kernels/measured.json with the new record beside
    assert [r["device"] for r in measured["sm90"]] == ["NVIDIA H200", "stand-in (no GPU)"], measured


def test_steps_rerun_only_those_named_against_the_kept_build(stand_in):
    first, again, tmp = stand_in
    before, after = results(tmp / "out"), results(tmp / "again")
    exits = {s["step"]: s["exit"] for s in after["steps"]}
    assert exits["power"] == 0 and exits["tests_gpu"] == 1, exits  # power rerun; tests_gpu's result kept
    ran = re.findall(r"^== (\w+) \(at most", again.stdout, re.M)
    assert ran == ["sass", "power"], again.stdout
    assert after["sass"]["library"] == before["sass"]["library"] and after["sass"]["found"], after["sass"]
