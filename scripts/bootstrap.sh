#!/usr/bin/env bash
# Create .venv with everything trainflow needs, idempotently.
#   bash scripts/bootstrap.sh            # then: .venv/bin/snakemake --profile profiles/local
# torch==2.13.0 goes in first: it is the CPU wheel on this kind of machine; a bare `torch` or a range
# resolved later would pull a multi-GB CUDA build.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
if [ ! -x .venv/bin/python ]; then
  "$PY" -m venv .venv
  echo "Created .venv"
fi
if ! .venv/bin/python -c "import torch, sys; sys.exit(torch.__version__.split('+')[0] != '2.13.0')" 2>/dev/null; then
  .venv/bin/pip install -q --disable-pip-version-check "torch==2.13.0"
  echo "Installed torch 2.13.0"
fi
if ! .venv/bin/python -c "import trainflow, snakemake, submitit, hydra, h5py, tokenizers, pyarrow, zstandard, crc32c, safetensors, tensorboard, transformers, pytest, hypothesis, ruff" 2>/dev/null \
   || [ pyproject.toml -nt .venv/.trainflow-installed ]; then
  .venv/bin/pip install -q --disable-pip-version-check -e ".[test]"
  touch .venv/.trainflow-installed
  echo "Installed trainflow and its dependencies"
fi
