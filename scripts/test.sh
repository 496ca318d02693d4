#!/usr/bin/env bash
# The test command of the README: set up the venv, check lint and format, start the local Slurm cluster, run the
# suite, stop Slurm.
#   bash scripts/test.sh [pytest args]
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/bootstrap.sh
.venv/bin/ruff check . && .venv/bin/ruff format --check .  # lint and format (pyproject.toml [tool.ruff])
bash scripts/slurm_cluster.sh start --nodes 2  # two emulated nodes: the multi-node test runs too
trap 'bash scripts/slurm_cluster.sh stop' EXIT
.venv/bin/python -m pytest "$@"
