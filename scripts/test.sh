#!/usr/bin/env bash
# The test command of the README: set up the venv, check lint and format, start the local Slurm cluster, run the
# suite, run the torch_compat subset again under the oldest supported torch, stop Slurm.
#   bash scripts/test.sh [pytest args]   # the args go to both runs; the second adds -m torch_compat
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/bootstrap.sh
.venv/bin/ruff check . && .venv/bin/ruff format --check .  # lint and format (pyproject.toml [tool.ruff])
# The oldest supported torch (pyproject.toml's range): 2.11.0, which the registry serves only as its CUDA build
# (~1.7 GB to download, 5.5 GB installed, ~2 min here; it runs on CPU), in .venv-torch211, kept between runs of
# this clone. trainflow goes in beside it through bootstrap.sh --system-torch, as into a container's torch. It is
# prepared in the background while the main suite runs (mostly download and unpacking: 125 s of CI time saved), its
# output in $OLD.log, shown once the suite is done. The subset (tests/conftest.py's TORCH_COMPAT) is the unit tests on
# torch's own APIs and the distributed tests that found 2.11's differences (trainflow.torch_compat): ~2 minutes,
# where the whole unit and distributed suite would take ~10 more.
OLD=.venv-torch211
prepare_old() {
  local start=$SECONDS
  if ! "$OLD/bin/python" -c "import torch, sys; sys.exit(torch.__version__.split('+')[0] != '2.11.0')" 2>/dev/null; then
    rm -rf "$OLD"
    bash scripts/need_disk.sh 8 . "$OLD (torch 2.11.0's CUDA build: 5.7 GB installed, 1.7 GB downloaded on the way)"
    python3 -m venv "$OLD"
    "$OLD/bin/python" -m pip install -q --disable-pip-version-check "torch==2.11.0"
    echo "Installed torch 2.11.0 into $OLD"
  fi
  PYTHON=$OLD/bin/python bash scripts/bootstrap.sh --system-torch
  echo "torch 2.11 environment ready in $((SECONDS - start)) s (beside the main suite)"
}
prepare_old >"$OLD.log" 2>&1 &
preparing=$!

# The cluster is machine-wide: stop it at the end only if this run started it.
if bash scripts/slurm_cluster.sh status >/dev/null 2>&1; then started=0; else started=1; fi
bash scripts/slurm_cluster.sh start --nodes 2  # two emulated nodes: the multi-node test runs too
trap 'kill "$preparing" 2>/dev/null || true; [ "$started" = 0 ] || bash scripts/slurm_cluster.sh stop' EXIT
.venv/bin/python -m pytest "$@"

if ! wait "$preparing"; then
  cat "$OLD.log"
  echo "test.sh: preparing $OLD failed (its output above, kept in $OLD.log)" >&2
  exit 1
fi
cat "$OLD.log"
start=$SECONDS
"$OLD/bin/python" -m pytest "$@" -m torch_compat
echo "torch 2.11 subset passed in $((SECONDS - start)) s"
