#!/usr/bin/env bash
# The FP8 GPU check (issues 25, 35, 46) for one machine with one H100/H200, no network, in at most 300 s of budgets:
# the carried wheels first (one line naming what is missing, exit 2), the environment, the visible GPU's kernel built
# once into a kept build cache (trainflow.fp8.build, its translation units in parallel), its SASS checked
# (trainflow.fp8.sass), tests/gpu with the kernel forced, benchmarks/fp8_gemm.py (every configuration of the kernel
# vs _scaled_mm vs bf16 per shape: kernels/measured.json's next record), one eager training step in bf16 and in fp8
# (benchmarks/gpu_step.py --compare), the power cap set and restored (scripts/gpu_check_steps/power.py), and the
# seed's downclock tried (trainflow.energy.dvfs_trial). Every figure goes into one JSON.
#
#   bash scripts/gpu_check.sh --prepare          # here, with the registry: the wheels the GPU machine lacks, into .whl/
#   bash scripts/gpu_check.sh --dry-run          # every step with its budget; exit 2 where a carried wheel is missing
#   bash scripts/gpu_check.sh [OUT_DIR]          # there: the whole check (OUT_DIR: default $OUT, else gpu_check/)
#   bash scripts/gpu_check.sh --steps sass,tests_gpu [OUT_DIR]   # rerun only those, against the kept build
#   bash scripts/gpu_check.sh --stand-in [OUT_DIR]  # anywhere: the GPU steps replaced by stand-ins of the same shape
#
# OUT_DIR receives at most 8 files: gpu_check.json (every step's exit, seconds and parsed output), gpu_check.log (the
# steps' stderr), steps.out (their stdout), tests_gpu.txt (pytest -rA: every test's outcome and each failing
# test's output), tests_gpu.xml (junit), build.log (the compile's own log) and measured.json (commit it as
# kernels/measured.json). What must outlive a run, the installed wheels, the build cache and each step's latest
# outputs, stays in $GPU_CHECK_KEEP (default .gpu_check/, git-ignored): --steps reruns the named steps there and
# merges them with the other steps' latest results.
#
# The GPU machine runs its own python3 and torch (2.11 or newer, Python 3.12) with trainflow from src/ on
# PYTHONPATH, nothing installed from the network. What it lacks (hydra-core, omegaconf, antlr4, submitit, crc32c,
# zstandard, and nvidia-cutlass for the CUTLASS headers) travels as wheels in .whl/ (git-ignored through
# .git/info/exclude; WHEELS overrides the folder), installed with --no-index into $GPU_CHECK_KEEP/site. Each step
# runs under its own budget (STEPS; GPU_CHECK_BUDGET_<step> overrides one), as a command or an exported function
# under `timeout`; a failed step is recorded and the next one runs, except that a wheel missing or not importable
# stops everything at once; the script exits 1 if any step failed. --stand-in runs the same runner, budgets, merge
# and evidence with each GPU step replaced (scripts/gpu_check_steps/stand_in.py; tests/unit/test_gpu_check.py).
set -uo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
PURE=(hydra-core omegaconf antlr4-python3-runtime submitit nvidia-cutlass)  # py3-none-any (antlr4: built from sdist)
BINARY=(crc32c zstandard)                                                    # CPython 3.12 manylinux wheels
WHEELS=${WHEELS:-.whl}
# name budget_s what: the steps in order. Budgets: the first run's times (gpu/h200-2026-12-04) with margin.
STEPS=(
  "wheels 5 the carried wheels installed and every module trainflow needs importable (2 s)"
  "environment 20 torch, CUDA, the GPU, nvcc, the dispatch's choice (over 10 s)"
  "build 90 the kernel's 7 translation units and its binding compiled in parallel into the kept cache (one unit: 137 s)"
  "sass 15 the build's SASS: QGMMA on E4M3 and E5M2, promotion FADDs, no HMMA or F2FP unpacking (11 s)"
  "tests_gpu 100 tests/gpu with the kernel forced: correctness, views, NaN/inf, NCCL gate, fp8 segment (71 s)"
  "fp8_gemm 25 TFLOP/s of each kernel configuration, _scaled_mm and bf16 on the 70B's tp8 shapes and 8192^3 (14 s)"
  "train_steps 30 one process: eager bf16 and fp8 steps with the time per linear split (three processes: 40+ s)"
  "power 5 the power cap set and restored, the energy counter read (1 s)"
  "dvfs 10 clocks locked below 500 MHz, at the top and reset: power at each over one matmul loop"
)
STEP_NAMES=$(for s in "${STEPS[@]}"; do echo "${s%% *}"; done | paste -sd, -)
FUNCTIONS=" wheels train_steps "  # steps that are shell functions, run through bash -c under timeout

budget() {  # budget NAME: STEPS' seconds, or $GPU_CHECK_BUDGET_NAME
  local step override="GPU_CHECK_BUDGET_$1"
  for step in "${STEPS[@]}"; do [ "${step%% *}" = "$1" ] && echo "${!override:-$(echo "$step" | cut -d' ' -f2)}"; done
}

# The carried distributions with no wheel in $WHEELS, one per line.
missing_wheels() {
  local name
  for name in "${PURE[@]}" "${BINARY[@]}"; do
    compgen -G "$WHEELS/$(echo "$name" | tr - _)-*.whl" >/dev/null || compgen -G "$WHEELS/$name-*.whl" >/dev/null || echo "$name"
  done
}

MODE=run SELECTED=$STEP_NAMES OUT_DIR=${OUT:-gpu_check}
while [ $# -gt 0 ]; do
  case $1 in
    --dry-run | --prepare) MODE=${1#--} ;;
    --stand-in) MODE=stand_in ;;
    --steps)
      SELECTED=${2:-}
      for name in ${SELECTED//,/ }; do
        [[ ",$STEP_NAMES," == *",$name,"* ]] || { echo "gpu_check: --steps $SELECTED: no step '$name' (steps: $STEP_NAMES)"; exit 2; }
      done
      shift ;;
    -*) echo "gpu_check: unknown option $1 (--prepare, --dry-run, --stand-in, --steps NAME,...)"; exit 2 ;;
    *) OUT_DIR=$1 ;;
  esac
  shift
done

if [ "$MODE" = dry-run ]; then
  total=0
  for step in "${STEPS[@]}"; do
    read -r name _ what <<<"$step"
    printf '%-12s %4s s  %s\n' "$name" "$(budget "$name")" "$what"
    total=$((total + $(budget "$name")))
  done
  echo "total: $total s of the 300 s allowed"
  missing=$(missing_wheels | paste -sd, -)
  if [ -n "$missing" ]; then
    echo "gpu_check: carried wheels missing from $WHEELS/: ${missing//,/, } (run bash scripts/gpu_check.sh --prepare here)"
    exit 2
  fi
  exit 0
fi

if [ "$MODE" = prepare ]; then
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

if [ "$MODE" = run ]; then
  missing=$(missing_wheels | paste -sd, -)
  if [ -n "$missing" ]; then
    echo "gpu_check: carried wheels missing from $WHEELS/: ${missing//,/, } (run bash scripts/gpu_check.sh --prepare and carry it)"
    exit 2
  fi
fi
KEEP=$(realpath -m "${GPU_CHECK_KEEP:-.gpu_check}")
WORK="$KEEP/work"  # each step's latest outputs: NAME.out, NAME.err, NAME.step ("NAME EXIT SECONDS")
if [ "$SELECTED" = "$STEP_NAMES" ]; then
  rm -rf "$WORK"
elif [[ ",$SELECTED," != *",wheels,"* && "$MODE" = run && ! -d "$KEEP/site" ]]; then
  echo "gpu_check: --steps $SELECTED needs the wheels a whole run installs into $KEEP/site: run the whole check first"
  exit 2
fi
mkdir -p "$WORK" "$OUT_DIR"
LOG="$OUT_DIR/gpu_check.log"
: >"$LOG"
START=$(date +%s)
export PY WHEELS WORK MODE PYTHONUNBUFFERED=1 MAX_JOBS=${MAX_JOBS:-$(nproc)} TRAINFLOW_KERNEL_CACHE="$KEEP/kernel-cache"
if [ "$MODE" = run ] && [ -z "${CUDA_HOME:-}" ]; then  # torch's extension builder needs the toolkit root
  if [ -x /usr/local/cuda/bin/nvcc ]; then CUDA_HOME=/usr/local/cuda; else CUDA_HOME=$(dirname "$(dirname "$(readlink -f "$(command -v nvcc)")")"); fi
  export CUDA_HOME
fi
export PYTHONPATH="$PWD/src:$PWD${PYTHONPATH:+:$PYTHONPATH}:$KEEP/site"

# run_step NAME COMMAND...: under NAME's budget, COMMAND's stdout into $WORK/NAME.out and stderr into $WORK/NAME.err
# (and the log); "NAME EXIT SECONDS" into $WORK/NAME.step. A step not selected by --steps keeps its last outputs.
# COMMAND may be a function: every step runs as `bash -c '"$@"'`, which finds the exported functions (timeout
# itself can only execute a program). --stand-in runs scripts/gpu_check_steps/stand_in.py NAME for the GPU steps.
run_step() {
  local name=$1 cap rc t0
  shift
  [[ ",$SELECTED," == *",$name,"* ]] || return 0
  cap=$(budget "$name")
  if [ "$MODE" = stand_in ] && [ "$name" != wheels ]; then set -- "$PY" scripts/gpu_check_steps/stand_in.py "$name" "$@"; fi
  echo "== $name (at most ${cap} s): $*" | tee -a "$LOG"
  t0=$(date +%s)
  timeout --kill-after=5 "$cap" bash -c '"$@"' "$name" "$@" >"$WORK/$name.out" 2>"$WORK/$name.err"
  rc=$?
  cat "$WORK/$name.err" >>"$LOG"
  echo "$name $rc $(($(date +%s) - t0))" >"$WORK/$name.step"
  echo "== $name: exit $rc after $(($(date +%s) - t0)) s$([ "$rc" = 124 ] && echo ": over its budget")" | tee -a "$LOG"
  return "$rc"
}

wheels() {  # the carried wheels into $KEEP/site (here, with --stand-in: the environment's own), then the imports
  if [ "$MODE" = run ]; then
    "$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target "${PYTHONPATH##*:}" \
      "$WHEELS"/*.whl >&2 || return 2
  fi
  "$PY" scripts/gpu_check_steps/importable.py "$MODE"
}
train_steps() {  # one process, eager: bf16, fp8 as dispatched, torchao where installed; the split per linear
  unset TRAINFLOW_FP8_BACKEND
  "$PY" benchmarks/gpu_step.py --compare --fp8 delayed --no-compile --steps 3 --warmup 1
}
export -f wheels train_steps

if ! run_step wheels wheels; then
  cat "$WORK/wheels.out" | tee -a "$LOG"
  exit 2
fi
run_step environment "$PY" scripts/gpu_check_steps/environment.py
run_step build "$PY" -m trainflow.fp8 "$TRAINFLOW_KERNEL_CACHE"
LIBRARY=$(find "$TRAINFLOW_KERNEL_CACHE" -name 'trainflow_fp8_sm*.so' 2>/dev/null | head -n 1)
ARCH=$(basename "${LIBRARY:-none}" .so | sed 's/^trainflow_fp8_//')
run_step sass "$PY" -m trainflow.fp8.sass "$ARCH" "${LIBRARY:-no build}"
TRAINFLOW_FP8_BACKEND=kernel run_step tests_gpu "$PY" -m pytest tests/gpu -q -rA -p no:cacheprovider \
  --junitxml="$WORK/tests_gpu.xml"
run_step fp8_gemm "$PY" benchmarks/fp8_gemm.py --repeats 7
run_step train_steps train_steps
run_step power "$PY" scripts/gpu_check_steps/power.py
run_step dvfs "$PY" -m trainflow.energy.dvfs_trial

"$PY" scripts/gpu_check_steps/merge.py "$WORK" "$OUT_DIR" "$(($(date +%s) - START))" "$STEP_NAMES" 2>&1 | tee -a "$LOG"
exit "${PIPESTATUS[0]}"
