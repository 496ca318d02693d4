#!/usr/bin/env bash
# Install trainflow and everything it needs, idempotently.
#   bash scripts/bootstrap.sh                  # .venv with torch 2.13.0; then: .venv/bin/snakemake --profile profiles/local
#   bash scripts/bootstrap.sh --system-torch   # into $PYTHON's (default python3's) environment, keeping its torch
# The default venv gets torch==2.13.0 first: it is the CPU wheel on this kind of machine; a bare `torch` or a range
# resolved later would pull a multi-GB CUDA build. --system-torch is for an environment that already has a torch of
# the supported range (pyproject.toml; trainflow.torch_compat.SUPPORTED): a container's (NGC's PyTorch on Alps, the
# Apptainer image of containers/), a venv made with --system-site-packages on top of one, or CI's torch 2.11 venv.
# It installs trainflow (editable) and its other dependencies and never installs, upgrades or removes torch.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
case "${1:-}" in
  "") ;;
  --system-torch)
    # torch's (major, minor), read as trainflow.torch_compat reads it (NGC's 2.11.0a0+<hash> is 2.11).
    version=$("$PY" -c "import torch; print(torch.__version__)" 2>/dev/null) || {
      echo "bootstrap.sh --system-torch: $PY cannot import torch; install a torch of pyproject.toml's range first, or drop --system-torch" >&2
      exit 1
    }
    "$PY" - "$version" <<'PYTHON' || exit 1
import re, sys, tomllib
version = sys.argv[1]
(pin,) = [d for d in tomllib.load(open("pyproject.toml", "rb"))["project"]["dependencies"] if re.match(r"torch\b", d)]
low, high = (tuple(map(int, v.split("."))) for v in re.fullmatch(r"torch>=([\d.]+),<([\d.]+)", pin).groups())
have = tuple(int(p) for p in version.split("+")[0].split(".")[:2])
if not low <= have < high:
    sys.exit(f"bootstrap.sh --system-torch: torch {version} is outside trainflow's range ({pin}); use a container or "
             "environment with a supported torch, or run bootstrap.sh without --system-torch for its own venv")
PYTHON
    stamp=$("$PY" -c "import sys; print(sys.prefix)")/.trainflow-installed
    if "$PY" -c "import sys, trainflow, snakemake, submitit, hydra, h5py, tokenizers, pytest, ruff; \
sys.exit(not trainflow.__file__.startswith('$PWD/src/'))" 2>/dev/null && [ -f "$stamp" ] && [ ! pyproject.toml -nt "$stamp" ]; then
      exit 0
    fi
    # pyproject's dependencies and test extras but torch, by name; torch pinned to what is there in case one needs it.
    mapfile -t deps < <("$PY" -c "import re, tomllib; p = tomllib.load(open('pyproject.toml', 'rb'))['project']; \
print('\n'.join(d for d in p['dependencies'] + p['optional-dependencies']['test'] if not re.match(r'torch\b', d)))")
    pins=$(mktemp)
    trap 'rm -f "$pins"' EXIT
    echo "torch==$version" >"$pins"
    "$PY" -m pip install -q --disable-pip-version-check -c "$pins" "${deps[@]}"
    "$PY" -m pip install -q --disable-pip-version-check --no-deps -e .
    after=$("$PY" -c "import torch; print(torch.__version__)")
    if [ "$after" != "$version" ]; then
      echo "bootstrap.sh --system-torch: torch changed from $version to $after; report this as a bug" >&2
      exit 1
    fi
    touch "$stamp" 2>/dev/null || true  # a read-only system prefix just installs again next time (pip: seconds)
    echo "Installed trainflow and its dependencies beside torch $version ($("$PY" -c "import sys; print(sys.prefix)"))"
    exit 0
    ;;
  *)
    echo "bootstrap.sh: unknown argument '$1'; use no argument (.venv) or --system-torch" >&2
    exit 2
    ;;
esac
if [ ! -x .venv/bin/python ]; then
  bash scripts/need_disk.sh 3 . "bootstrap.sh's .venv (torch 2.13.0 CPU and the rest: 2.0 GB installed)"
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
