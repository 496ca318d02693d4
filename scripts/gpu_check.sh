#!/usr/bin/env bash
# The FP8 GPU check (issues 25, 35) for one machine with one H100/H200, no network, under 6 minutes: the carried
# wheels first (one line naming what is missing, exit 2), then the visible GPU's kernel built once into a build cache
# (trainflow.fp8.build, as the build_kernels stage does), its SASS checked (trainflow.fp8.sass: exit 1 on a wrong
# build), tests/gpu with the kernel forced (its correctness on tails, views, NaN / inf; the gate's patterns in a
# one-GPU NCCL group and a short fp8 training segment through the real stage modules), benchmarks/fp8_gemm.py
# (each configuration of the kernel vs _scaled_mm vs bf16 on Llama 3 70B's tp8 linears and 8192^3: which is
# fastest per shape, and what the unmeasured heuristic would have run), one fp8 training step through each
# backend (the kernel forced, _scaled_mm) and bf16, and the power cap set and restored with the energy counter read
# through trainflow.energy.nvml. Every figure goes into one JSON, and kernels/measured.json's update from it.
#
#   bash scripts/gpu_check.sh --prepare     # here, with the registry: the wheels the GPU machine lacks, into .whl/
#   bash scripts/gpu_check.sh --dry-run     # every step with its time budget; exit 2 where a carried wheel is missing
#   bash scripts/gpu_check.sh [OUT_DIR]     # there: OUT_DIR (default $OUT, else gpu_check/) gets gpu_check.json,
#                                           # measured.json (commit as kernels/measured.json) and gpu_check.log
#
# The GPU machine runs its own python3 and torch (2.11 or newer, Python 3.12) with trainflow from src/ on
# PYTHONPATH, nothing installed from the network. What it lacks (hydra-core, omegaconf, antlr4, submitit, crc32c,
# zstandard, and nvidia-cutlass for the CUTLASS headers) travels as wheels in .whl/ (git-ignored through
# .git/info/exclude; WHEELS overrides the folder), installed with --no-index into a folder of /tmp. Each step runs
# under its own budget (STEPS); a failed step is recorded and the next one runs, except that a wheel missing or not
# importable stops everything at once; the script exits 1 if any step failed.
set -uo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
PURE=(hydra-core omegaconf antlr4-python3-runtime submitit nvidia-cutlass)  # py3-none-any (antlr4: built from sdist)
BINARY=(crc32c zstandard)                                                    # CPython 3.12 manylinux wheels
WHEELS=${WHEELS:-.whl}
# name budget_s what: the steps in order; the budgets sum to under 360 s (tests/unit/test_gpu_check.py)
STEPS=(
  "wheels 10 the carried wheels installed and every module trainflow needs importable"
  "environment 10 torch, CUDA, the GPU, nvcc, the dispatch's choice"
  "build 140 the visible GPU's kernel compiled once into the build cache (python -m trainflow.fp8)"
  "sass 15 the build's SASS: QGMMA on E4M3 and E5M2, promotion FADDs, no HMMA or F2FP unpacking"
  "tests_gpu 85 tests/gpu with the kernel forced: correctness, views, NaN/inf, NCCL gate, a training segment"
  "fp8_gemm 45 TFLOP/s of each kernel configuration, _scaled_mm and bf16 on the 70B's tp8 shapes and 8192^3"
  "train_steps 40 one fp8 training step through the kernel (forced) and _scaled_mm, and bf16"
  "power 10 the power cap set and restored, the energy counter read (trainflow.energy.nvml)"
)

# The carried distributions with no wheel in $WHEELS, one per line.
missing_wheels() {
  local name
  for name in "${PURE[@]}" "${BINARY[@]}"; do
    compgen -G "$WHEELS/$(echo "$name" | tr - _)-*.whl" >/dev/null || compgen -G "$WHEELS/$name-*.whl" >/dev/null || echo "$name"
  done
}

if [ "${1:-}" = "--dry-run" ]; then
  total=0
  for step in "${STEPS[@]}"; do
    read -r name budget what <<<"$step"
    printf '%-12s %4s s  %s\n' "$name" "$budget" "$what"
    total=$((total + budget))
  done
  echo "total: $total s of the 360 s allowed"
  missing=$(missing_wheels | paste -sd, -)
  if [ -n "$missing" ]; then
    echo "gpu_check: carried wheels missing from $WHEELS/: ${missing//,/, } (run bash scripts/gpu_check.sh --prepare here)"
    exit 2
  fi
  exit 0
fi

if [ "${1:-}" = "--prepare" ]; then
  set -e
  # The versions CI tests with: those of .venv (scripts/bootstrap.sh).
  pins() { .venv/bin/python -c "import importlib.metadata as m, sys; print(' '.join(f'{n}=={m.version(n)}' for n in sys.argv[1:]))" "$@"; }
  rm -rf "$WHEELS" && mkdir "$WHEELS"
  # shellcheck disable=SC2046  # one argument per pin
  .venv/bin/python -m pip wheel -q --no-deps -w "$WHEELS" $(pins "${PURE[@]}")
  # shellcheck disable=SC2046
  .venv/bin/python -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
    --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
    -d "$WHEELS" $(pins "${BINARY[@]}")
  exclude=$(git rev-parse --git-path info/exclude)
  mkdir -p "$(dirname "$exclude")" && touch "$exclude"
  grep -qxF '/.whl/' "$exclude" || echo '/.whl/' >>"$exclude"
  echo "Prepared $(ls .whl | wc -l) wheels ($(du -sh .whl | cut -f1)) in .whl/: carry .whl with the run"
  ls .whl
  exit 0
fi

OUT_DIR=${1:-${OUT:-gpu_check}}
missing=$(missing_wheels | paste -sd, -)
if [ -n "$missing" ]; then
  echo "gpu_check: carried wheels missing from $WHEELS/: ${missing//,/, } (run bash scripts/gpu_check.sh --prepare and carry it)"
  exit 2
fi
mkdir -p "$OUT_DIR"
WORK=$(mktemp -d /tmp/gpu_check.XXXXXX)  # per-step outputs; only the merged files go to OUT_DIR
LOG="$OUT_DIR/gpu_check.log"
: >"$LOG"
START=$(date +%s)
export PYTHONUNBUFFERED=1 MAX_JOBS=${MAX_JOBS:-$(nproc)} TRAINFLOW_KERNEL_CACHE="$WORK/kernel-cache"
if [ -z "${CUDA_HOME:-}" ]; then  # torch's extension builder needs the toolkit root; nvcc may be a wrapper elsewhere
  if [ -x /usr/local/cuda/bin/nvcc ]; then CUDA_HOME=/usr/local/cuda; else CUDA_HOME=$(dirname "$(dirname "$(readlink -f "$(command -v nvcc)")")"); fi
  export CUDA_HOME
fi
export PYTHONPATH="$PWD/src:$PWD${PYTHONPATH:+:$PYTHONPATH}:$WORK/site"

# run_step NAME COMMAND...: COMMAND's stdout into $WORK/NAME.out, stderr into the log, under NAME's budget (STEPS);
# one "NAME EXIT SECONDS" line in steps.txt.
run_step() {
  local name=$1 cap rc t0 step
  shift
  for step in "${STEPS[@]}"; do [ "${step%% *}" = "$name" ] && cap=$(echo "$step" | cut -d' ' -f2); done
  echo "== $name (at most ${cap} s): $*" | tee -a "$LOG"
  t0=$(date +%s)
  timeout --kill-after=5 "$cap" "$@" >"$WORK/$name.out" 2>>"$LOG"
  rc=$?
  echo "$name $rc $(($(date +%s) - t0))" >>"$WORK/steps.txt"
  echo "== $name: exit $rc after $(($(date +%s) - t0)) s" | tee -a "$LOG"
  return "$rc"
}

wheels() {
  "$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target "$WORK/site" "$WHEELS"/*.whl >&2 &&
    "$PY" -c '
import importlib.util, sys
needed = ("hydra", "omegaconf", "submitit", "crc32c", "zstandard", "cutlass_library", "pynvml", "yaml", "ninja", "torch")
missing = [n for n in needed if importlib.util.find_spec(n) is None]
print(f"gpu_check: not importable after installing the carried wheels: {chr(44).join(missing)}" if missing else "all importable")
sys.exit(2 if missing else 0)'
}
if ! run_step wheels wheels; then
  cat "$WORK/wheels.out" | tee -a "$LOG"
  rm -rf "$WORK"
  exit 2
fi

run_step environment "$PY" - <<'PYTHON'
import json, subprocess, sys
import torch
from trainflow.fp8.kernels import backend_reason
def out(cmd):
    try:
        return subprocess.run(cmd, capture_output=True, text=True, timeout=30).stdout.strip()
    except (OSError, subprocess.SubprocessError) as err:
        return f"unavailable: {err}"
json.dump({
    "python": sys.version.split()[0], "torch": torch.__version__, "torch_cuda": torch.version.cuda,
    "device": torch.cuda.get_device_name(), "capability": torch.cuda.get_device_capability(),
    "nvidia_smi": out(["nvidia-smi", "--query-gpu=name,driver_version,clocks.max.sm,power.limit", "--format=csv,noheader"]),
    "nvcc": out(["nvcc", "--version"]).splitlines()[-1:],
    "fp8_backend_unforced": backend_reason(torch.device("cuda")),
}, sys.stdout, indent=1)
PYTHON

run_step build "$PY" -m trainflow.fp8 "$TRAINFLOW_KERNEL_CACHE"
LIBRARY=$(find "$TRAINFLOW_KERNEL_CACHE" -name 'trainflow_fp8_sm*.so' 2>/dev/null | head -n 1)
ARCH=$(basename "${LIBRARY:-none}" .so | sed 's/^trainflow_fp8_//')
run_step sass "$PY" -m trainflow.fp8.sass "$ARCH" "${LIBRARY:-no build}"

export TRAINFLOW_FP8_BACKEND=kernel  # the kernel runs wherever fp8 runs from here on, measured or not
run_step tests_gpu "$PY" -m pytest tests/gpu -q -rs -p no:cacheprovider --junitxml="$WORK/tests_gpu.xml"
run_step fp8_gemm "$PY" benchmarks/fp8_gemm.py --repeats 7
train_steps() {
  local run
  for run in "bf16 none" "fp8_kernel delayed" "fp8_scaled_mm delayed"; do
    set -- $run
    if [ "$1" = fp8_scaled_mm ]; then unset TRAINFLOW_FP8_BACKEND; fi
    "$PY" benchmarks/gpu_step.py --steps 3 --warmup 1 --no-compile --fp8 "$2" >"$WORK/step_$1.json" || return 1
  done
  export TRAINFLOW_FP8_BACKEND=kernel
}
run_step train_steps train_steps
unset TRAINFLOW_FP8_BACKEND

run_step power "$PY" - <<'PYTHON'
import json, sys
from trainflow.energy.nvml import NodeGpus
gpus, why = NodeGpus.open()
if gpus is None:
    sys.exit(f"gpu_check: {why}")
try:
    before, limit = gpus.energy_j(), gpus.power_limit_w(0)
    low, high = gpus.power_limit_range_w(0)
    cap = max(low, round(0.8 * limit))
    gpus.set_power_limit_w(0, cap)
    capped = gpus.power_limit_w(0)
    gpus.set_power_limit_w(0, limit)
    restored, after = gpus.power_limit_w(0), gpus.energy_j()
finally:
    gpus.close()
json.dump({"limit_w": limit, "range_w": [low, high], "set_w": cap, "read_back_w": capped, "restored_w": restored,
           "energy_j": [before, after]}, sys.stdout)
sys.exit(0 if capped == cap and restored == limit and after and after[0] >= before[0] else 1)
PYTHON

"$PY" - "$WORK" "$OUT_DIR" "$(($(date +%s) - START))" <<'PYTHON' 2>&1 | tee -a "$LOG"
import json, sys
import xml.etree.ElementTree as ET
from pathlib import Path
from trainflow.fp8.kernels import KernelMeasurement, kernels_folder, read_measured
work, out, total_s = Path(sys.argv[1]), Path(sys.argv[2]), int(sys.argv[3])
def read_json(path, last_line=False):
    try:
        text = path.read_text()
        return json.loads(text.strip().splitlines()[-1] if last_line else text)
    except (OSError, ValueError, IndexError) as err:
        return {"unreadable": str(err)}
steps = [line.split() for line in (work / "steps.txt").read_text().splitlines()]
steps = [{"step": name, "exit": int(rc), "seconds": int(s)} for name, rc, s in steps]
result = {"seconds": total_s, "steps": steps, "passed": all(s["exit"] == 0 for s in steps)}
for name in ("environment", "fp8_gemm", "power", "sass"):
    result[name] = read_json(work / f"{name}.out", last_line=name == "sass")
result["build"] = (work / "build.out").read_text().strip()
result["train_steps"] = {p.stem.removeprefix("step_"): read_json(p) for p in sorted(work.glob("step_*.json"))}
if (work / "tests_gpu.xml").is_file():
    root = ET.parse(work / "tests_gpu.xml").getroot()
    suite = root if root.tag == "testsuite" else root.find("testsuite")
    result["tests_gpu"] = {k: int(suite.get(k, 0)) for k in ("tests", "failures", "errors", "skipped")}
    result["tests_gpu"]["failed"] = [f"{c.get('classname')}::{c.get('name')}" for c in suite.iter("testcase")
                                     if c.find("failure") is not None or c.find("error") is not None]
steps_s = result["train_steps"]
if all(k in steps_s and "tokens_per_s" in steps_s[k] for k in ("bf16", "fp8_kernel", "fp8_scaled_mm")):
    result["fp8_over_bf16"] = {k: round(steps_s[k]["tokens_per_s"] / steps_s["bf16"]["tokens_per_s"], 3) for k in ("fp8_kernel", "fp8_scaled_mm")}
(out / "gpu_check.json").write_text(json.dumps(result, indent=1) + "\n")
new = result["fp8_gemm"].get("measured", {})
if new:  # kernels/measured.json with this device's and build's records replaced: commit it from OUT_DIR
    merged = {arch: [m.to_json() for m in records] for arch, records in read_measured().items()} or {"sm89": [], "sm90": []}
    for arch, record in new.items():
        m = KernelMeasurement.from_json(record)
        merged[arch] = [r for r in merged[arch] if (r["device"], r["build_key"]) != (m.device, m.to_json()["build_key"])] + [record]
    (out / "measured.json").write_text(json.dumps(merged, indent=1) + "\n")
shapes = result["fp8_gemm"].get("shapes", [])  # per shape: the fastest configuration and the heuristic's choice
result["dispatch"] = {r["shape"]: {"fastest": r.get("fastest_config"), "heuristic": r.get("heuristic")} for r in shapes}
print(json.dumps({k: result.get(k) for k in ("tests_gpu", "sass", "fp8_over_bf16", "power", "dispatch")}, indent=1))
print(f"gpu_check: {'passed' if result['passed'] else 'FAILED'} in {total_s} s: "
      + ", ".join(f"{s['step']} exit {s['exit']} ({s['seconds']} s)" for s in steps))
sys.exit(0 if result["passed"] else 1)
PYTHON
rc=$?
rm -rf "$WORK"
exit "$rc"
