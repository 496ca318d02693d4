"""The container wiring on the real local Slurm cluster: validate_nccl's ranks start through `apptainer exec`, as
tests/slurm/golden/slurm_local_apptainer.sbatch shows, and nccl.json records the image every rank saw.

Debian has no Apptainer, so a stand-in named `apptainer` on PATH takes its place: it drops apptainer's options and
runs the command on the host with TRAINFLOW_IMAGE set, as containers/trainflow.def's %environment sets it. What
this checks is trainflow's side (the srun line submitit runs, the interpreter it starts, the stack recorded inside
the ranks' environment), not Apptainer itself.
"""

from __future__ import annotations

import os
import sys

import pytest

from tests.conftest import make_config, read_json
from trainflow.stages import validate_nccl

pytestmark = pytest.mark.slurm

STAND_IN = """#!/bin/sh
# apptainer exec [--nv] [--bind SPEC]... IMAGE COMMAND...: COMMAND on the host, TRAINFLOW_IMAGE=stand-in:IMAGE
[ "$1" = exec ] || exit 64
shift
while [ "${1#--}" != "$1" ]; do
  if [ "$1" = --bind ]; then shift 2; else shift; fi
done
image=$1
shift
TRAINFLOW_IMAGE="stand-in:$image" exec "$@"
"""


def test_the_gate_s_ranks_run_in_the_image_and_record_it(tmp_path, monkeypatch):
    (tmp_path / "bin").mkdir()
    apptainer = tmp_path / "bin/apptainer"
    apptainer.write_text(STAND_IN)
    apptainer.chmod(0o755)
    image = tmp_path / "trainflow.sif"
    image.write_bytes(b"")
    monkeypatch.setenv("PATH", f"{tmp_path / 'bin'}{os.pathsep}{os.environ['PATH']}")  # srun passes it to the ranks
    cfg = make_config(
        "validate_nccl",
        tmp_path,
        "cluster=slurm_local",
        f"cluster.allocation.container.sif={image}",
        f"cluster.allocation.container.python={sys.executable}",  # the image's python3 is this venv's here
        "cluster.gate.sweep_mb=[1.0]",
        "cluster.gate.sweep_iters=2",
    )
    validate_nccl.run(cfg)
    report = read_json(cfg.io.nccl_report)
    assert [h["versions"]["image"] for h in report["hosts"]] == [f"stand-in:{image}"] * 2
    (script,) = (tmp_path / "submitit/validate_nccl").glob("*_submission.sh")
    assert f"apptainer exec --bind {(tmp_path / 'submitit/validate_nccl').resolve()} {image} {sys.executable}" in (
        script.read_text()
    )
