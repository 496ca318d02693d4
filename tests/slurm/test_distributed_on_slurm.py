"""train_segment's submitit jobs on the local Slurm cluster: four ranks, and cancelling an abandoned job.

bash scripts/slurm_cluster.sh start --nodes 2 && .venv/bin/python -m pytest tests/slurm/test_distributed_on_slurm.py
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.conftest import make_config, read_json
from tests.slurm.conftest import final_states, idle_nodes
from trainflow.stages import train_segment

pytestmark = pytest.mark.slurm


def test_tensor_and_pipeline_parallel_segment_on_four_slurm_ranks(tmp_path, tokens):
    nodes = idle_nodes()
    if len(nodes) >= 2:
        shape = 2  # two emulated nodes x 2 tasks: ranks 0-1 on the first, 2-3 on the second
    elif max(nodes.values(), default=0) >= 4:
        shape = 1
    else:
        pytest.skip(
            f"4 ranks need 2 nodes or 4 CPUs on one; the cluster has {len(nodes)} node(s) of "
            f"{max(nodes.values(), default=0)} CPUs: bash scripts/slurm_cluster.sh start --nodes 2"
        )
    cfg = make_config(
        "train_segment",
        tmp_path,
        "cluster=slurm_local",
        f"cluster.allocation.nodes={shape}",
        "parallel=tp2_pp2",
        "train.segments=1",
        tokens=tokens,
    )
    train_segment.run(cfg)
    summary = read_json(cfg.io.segment_report)
    assert summary["completed"] and summary["setup"]["layout"]["world_size"] == 4
    assert (summary["setup"]["layout"]["tp"], summary["setup"]["layout"]["pp"]) == (2, 2)
    logs = {p.name: p.read_text() for p in Path(cfg.io.submitit).glob("*_log.out")}
    (job,) = {name.split("_")[0] for name in logs}
    assert final_states([job]) == {job: "COMPLETED"}
    # submitit's JobEnvironment line of every rank: global rank r of 4 on node r // (4 / shape).
    places = sorted(re.search(r"node=(\d+)\(\d+\), global_rank=(\d+)\(4\)", text).groups() for text in logs.values())
    assert sorted((int(r), int(n)) for n, r in places) == [(r, r // (4 // shape)) for r in range(4)]


def test_interrupted_stage_cancels_its_slurm_job(tmp_path, tokens):
    """Snakemake stopping a local rule (SIGTERM) must not orphan the training job it submitted."""
    name = f"cancel{os.getpid()}"
    overrides = [
        f"run={name}",
        "experiment=smoke",
        "cluster=slurm_local",
        f"storage.root={tmp_path}",
        f"io.staged_tokens={tokens}",
        "train.segment_steps=100000",
    ]
    stage = subprocess.Popen(
        [sys.executable, "-m", "trainflow.stages.train_segment", *overrides],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:
        deadline = time.monotonic() + 60
        while not (
            job := subprocess.run(
                ["squeue", "-h", "-n", f"{name}-train-0", "-o", "%i"], capture_output=True, text=True
            ).stdout.strip()
        ):
            assert time.monotonic() < deadline and stage.poll() is None, "the stage submitted no Slurm job in 60 s"
            time.sleep(0.5)
        stage.send_signal(signal.SIGTERM)
        output, _ = stage.communicate(timeout=60)
    finally:
        stage.kill()
    assert stage.returncode != 0
    assert f"Cancelled slurm job {job}: the stage waiting for it was interrupted" in output
    assert final_states([job]) == {job: "CANCELLED"}
