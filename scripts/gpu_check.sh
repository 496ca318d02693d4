#!/usr/bin/env bash
# The FP8 GPU check (issue 25) for one machine with one H100/H200, no network, under 8 minutes: builds both
# kernels of kernels/ (sm_89 mma.sync, sm_90a CUTLASS) through torch's extension builder, counts the tensor-core
# instructions in the built machine code, runs benchmarks/fp8_gemm.py (8192^3, 4096^3 and Llama 3 70B's tp8
# linears), tests/gpu, and benchmarks/gpu_step.py with fp8 off and on, and writes every figure into one JSON.
#
#   bash scripts/gpu_check.sh --prepare     # here, with the registry: the wheels the GPU machine lacks, into .whl/
#   bash scripts/gpu_check.sh [OUT_DIR]     # there: OUT_DIR (default $OUT, else gpu_check/) gets gpu_check.json,
#                                           # measured.json (commit as kernels/measured.json) and gpu_check.log
#
# The GPU machine runs its own python3 and torch (2.11 or newer, Python 3.12) with trainflow from src/ on
# PYTHONPATH, nothing installed from the network. What it lacks (hydra-core, omegaconf, antlr4, submitit, crc32c,
# zstandard, and nvidia-cutlass for the CUTLASS headers) travels as wheels in .whl/ (git-ignored through
# .git/info/exclude), installed with --no-index into a folder of /tmp. Each step runs under its own time limit
# inside one overall deadline (DEADLINE_S, default 470 s); a failed step is recorded and the next one runs, and
# the script exits 1 if any step failed.
set -uo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
PURE=(hydra-core omegaconf antlr4-python3-runtime submitit nvidia-cutlass)  # py3-none-any (antlr4: built from sdist)
BINARY=(crc32c zstandard)                                                    # CPython 3.12 manylinux wheels

if [ "${1:-}" = "--prepare" ]; then
  set -e
  # The versions CI tests with: those of .venv (scripts/bootstrap.sh).
  pins() { .venv/bin/python -c "import importlib.metadata as m, sys; print(' '.join(f'{n}=={m.version(n)}' for n in sys.argv[1:]))" "$@"; }
  rm -rf .whl && mkdir .whl
  # shellcheck disable=SC2046  # one argument per pin
  .venv/bin/python -m pip wheel -q --no-deps -w .whl $(pins "${PURE[@]}")
  # shellcheck disable=SC2046
  .venv/bin/python -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
    --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
    -d .whl $(pins "${BINARY[@]}")
  exclude=$(git rev-parse --git-path info/exclude)
  mkdir -p "$(dirname "$exclude")" && touch "$exclude"
  grep -qxF '/.whl/' "$exclude" || echo '/.whl/' >>"$exclude"
  echo "Prepared $(ls .whl | wc -l) wheels ($(du -sh .whl | cut -f1)) in .whl/: carry .whl with the run"
  ls .whl
  exit 0
fi

OUT_DIR=${1:-${OUT:-gpu_check}}
mkdir -p "$OUT_DIR"
WORK=$(mktemp -d /tmp/gpu_check.XXXXXX)  # per-step outputs; only the merged files go to OUT_DIR
LOG="$OUT_DIR/gpu_check.log"
: >"$LOG"
START=$(date +%s)
DEADLINE=$((START + ${DEADLINE_S:-470}))
export PYTHONUNBUFFERED=1 TORCH_EXTENSIONS_DIR="$WORK/extensions" MAX_JOBS=${MAX_JOBS:-$(nproc)}
if [ -z "${CUDA_HOME:-}" ]; then  # torch's extension builder needs the toolkit root; nvcc may be a wrapper elsewhere
  if [ -x /usr/local/cuda/bin/nvcc ]; then CUDA_HOME=/usr/local/cuda; else CUDA_HOME=$(dirname "$(dirname "$(readlink -f "$(command -v nvcc)")")"); fi
  export CUDA_HOME
fi
export PYTHONPATH="$PWD/src${PYTHONPATH:+:$PYTHONPATH}"
if compgen -G ".whl/*.whl" >/dev/null; then
  "$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target "$WORK/site" .whl/*.whl \
    >>"$LOG" 2>&1 || echo "gpu_check: installing .whl/ failed (see the log)" | tee -a "$LOG"
  export PYTHONPATH="$PYTHONPATH:$WORK/site"  # ahead of the machine's site-packages, which lack these anyway
fi

# run_step NAME CAP_S COMMAND...: COMMAND's stdout into $WORK/NAME.out, stderr into the log, under
# min(CAP_S, what is left before the deadline less 20 s for the merge); one "NAME EXIT SECONDS" line in steps.txt.
run_step() {
  local name=$1 cap=$2 left rc t0
  shift 2
  left=$((DEADLINE - $(date +%s) - 20))
  [ "$left" -lt "$cap" ] && cap=$left
  if [ "$cap" -le 0 ]; then
    echo "$name 124 0" >>"$WORK/steps.txt"
    echo "== $name: skipped, the deadline has passed" | tee -a "$LOG"
    return
  fi
  echo "== $name (at most ${cap} s): $*" | tee -a "$LOG"
  t0=$(date +%s)
  timeout --kill-after=10 "$cap" "$@" >"$WORK/$name.out" 2>>"$LOG"
  rc=$?
  echo "$name $rc $(($(date +%s) - t0))" >>"$WORK/steps.txt"
  echo "== $name: exit $rc after $(($(date +%s) - t0)) s" | tee -a "$LOG"
}

run_step environment 60 "$PY" - <<'PYTHON'
import importlib.util, json, shutil, subprocess, sys
import torch
from trainflow.fp8.kernels import backend_reason
def out(cmd):
    try:
        return subprocess.run(cmd, capture_output=True, text=True, timeout=30).stdout.strip()
    except (OSError, subprocess.SubprocessError) as err:
        return f"unavailable: {err}"
needed = ("hydra", "omegaconf", "submitit", "crc32c", "zstandard", "cutlass_library", "h5py", "yaml", "ninja")
gpu = torch.cuda.is_available()
json.dump({
    "python": sys.version.split()[0], "torch": torch.__version__, "torch_cuda": torch.version.cuda,
    "device": torch.cuda.get_device_name() if gpu else None,
    "capability": torch.cuda.get_device_capability() if gpu else None,
    "nvidia_smi": out(["nvidia-smi", "--query-gpu=name,driver_version,clocks.max.sm,power.limit", "--format=csv,noheader"]),
    "nvcc": out(["nvcc", "--version"]).splitlines()[-1:], "cuobjdump": shutil.which("cuobjdump"),
    "missing_modules": [name for name in needed if importlib.util.find_spec(name) is None],
    "fp8_backend": backend_reason(torch.device("cuda")) if gpu else None,
}, sys.stdout, indent=1)
PYTHON

run_step build 300 "$PY" - <<'PYTHON'
import json, sys, time
from trainflow.fp8.kernels import KERNEL_BUILDS, build_extension
result = {}
for capability, build in KERNEL_BUILDS.items():  # both kernels build here; only this GPU's runs
    t0 = time.perf_counter()
    try:
        build_extension(capability=capability)
        result[build.arch] = {"built": True, "seconds": round(time.perf_counter() - t0, 1)}
    except Exception as err:  # noqa: BLE001 - recorded, and the next build still runs
        result[build.arch] = {"built": False, "seconds": round(time.perf_counter() - t0, 1), "error": str(err)[-2000:]}
json.dump(result, sys.stdout, indent=1)
sys.exit(0 if all(r["built"] for r in result.values()) else 1)
PYTHON

# The built machine code: instructions per opcode (QGMMA: wgmma on fp8; QMMA: fp8 mma.sync; FADD: promotions;
# HMMA and F2FP.F16.E4M3/E5M2 unpacking: the fp16 emulation that must be absent).
CUOBJDUMP=$(command -v cuobjdump || echo "${CUDA_HOME:-/usr/local/cuda}/bin/cuobjdump")
for arch in sm89 sm90; do
  so=$(find "$TORCH_EXTENSIONS_DIR" -name "trainflow_fp8_$arch.so" 2>/dev/null | head -n 1)
  if [ -n "$so" ] && [ -x "$CUOBJDUMP" ]; then
    run_step "sass_$arch" 60 bash -c "'$CUOBJDUMP' --dump-sass '$so' | grep -oE '\b(QGMMA|QMMA|HMMA|F2FP|FADD)[A-Z0-9_.x]*' | sort | uniq -c"
  fi
done

run_step fp8_gemm 150 "$PY" benchmarks/fp8_gemm.py
run_step tests_gpu 240 "$PY" -m pytest tests/gpu -q -rs -p no:cacheprovider --junitxml="$WORK/tests_gpu.xml"
run_step gpu_step_bf16 150 "$PY" benchmarks/gpu_step.py --steps 8
run_step gpu_step_fp8 150 "$PY" benchmarks/gpu_step.py --steps 8 --fp8 delayed

"$PY" - "$WORK" "$OUT_DIR" "$(($(date +%s) - START))" <<'PYTHON' 2>&1 | tee -a "$LOG"
import json, re, sys
import xml.etree.ElementTree as ET
from pathlib import Path
work, out, total_s = Path(sys.argv[1]), Path(sys.argv[2]), int(sys.argv[3])
def read_json(name):
    try:
        return json.loads((work / f"{name}.out").read_text())
    except (OSError, ValueError) as err:
        return {"unreadable": str(err)}
steps = [line.split() for line in (work / "steps.txt").read_text().splitlines()]
steps = [{"step": name, "exit": int(rc), "seconds": int(s)} for name, rc, s in steps]
result = {"seconds": total_s, "steps": steps, "passed": all(s["exit"] == 0 for s in steps)}
for name in ("environment", "build", "fp8_gemm", "gpu_step_bf16", "gpu_step_fp8"):
    result[name] = read_json(name)
result["sass"] = {
    p.stem.removeprefix("sass_"): {op: int(n) for n, op in re.findall(r"(\d+)\s+(\S+)", p.read_text())}
    for p in sorted(work.glob("sass_*.out"))
}
if (work / "tests_gpu.xml").is_file():
    root = ET.parse(work / "tests_gpu.xml").getroot()
    suite = root if root.tag == "testsuite" else root.find("testsuite")
    result["tests_gpu"] = {k: int(suite.get(k, 0)) for k in ("tests", "failures", "errors", "skipped")}
    result["tests_gpu"]["failed"] = [
        f"{c.get('classname')}::{c.get('name')}"
        for c in suite.iter("testcase")
        if c.find("failure") is not None or c.find("error") is not None
    ]
bf16, fp8 = result["gpu_step_bf16"], result["gpu_step_fp8"]
if "tokens_per_s" in bf16 and "tokens_per_s" in fp8:
    ratio = fp8["tokens_per_s"] / bf16["tokens_per_s"]
    result["gpu_step_fp8_over_bf16"] = {"tokens_per_s": round(ratio, 3), "goal": 1.2, "met": ratio >= 1.2}
(out / "gpu_check.json").write_text(json.dumps(result, indent=1) + "\n")
if "measured" in result["fp8_gemm"]:
    (out / "measured.json").write_text(json.dumps(result["fp8_gemm"]["measured"], indent=1) + "\n")
summary = {k: result.get(k) for k in ("tests_gpu", "sass", "gpu_step_fp8_over_bf16")}
summary["fp8_gemm"] = {k: result["fp8_gemm"].get(k) for k in ("correctness", "goal_8192")}
print(json.dumps(summary, indent=1))
print(f"gpu_check: {'passed' if result['passed'] else 'FAILED'} in {total_s} s: "
      + ", ".join(f"{s['step']} exit {s['exit']} ({s['seconds']} s)" for s in steps))
sys.exit(0 if result["passed"] else 1)
PYTHON
rc=$?
rm -rf "$WORK"
exit "$rc"
