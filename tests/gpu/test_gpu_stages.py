"""The real stage modules on one CUDA GPU over NCCL: the gate's patterns in a one-rank NCCL group
(trainflow.stages.validate_nccl) and a short fp8 training segment (trainflow.stages.train_segment, its ranks
started by submitit as in a campaign). Skipped without a GPU, except the check that their overrides compose.

    .venv/bin/python -m pytest tests/gpu/test_gpu_stages.py -q -rs      # scripts/gpu_check.sh runs it
"""

from __future__ import annotations

import math

import pytest
import torch

from tests.conftest import make_config, run_segment
from trainflow.gate.report import NcclReport
from trainflow.records import read_record
from trainflow.stages import validate_nccl

GPU_RUN = (
    "cluster.runtime.device=cuda",
    "cluster.runtime.backend=nccl",
    "cluster.allocation.gpus_per_node=1",
    "parallel=single",
    "train.precision=bf16",
    "train.fp8=delayed",
    "train.segments=1",
    "train.segment_steps=6",
    "checkpoint.interval_steps=100",
)
needs_gpu = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")


def test_the_gpu_overrides_compose(tmp_path):
    cfg = make_config("train_segment", tmp_path, *GPU_RUN)
    assert (cfg.cluster.runtime.device, cfg.cluster.runtime.backend, cfg.train.fp8) == ("cuda", "nccl", "delayed")


@pytest.mark.gpu
@needs_gpu
def test_the_gate_runs_its_patterns_over_a_one_gpu_nccl_group(tmp_path, fixed_tokens):
    cfg = make_config("validate_nccl", tmp_path, *GPU_RUN, tokens=fixed_tokens)
    validate_nccl.run(cfg)
    report = read_record(NcclReport, cfg.io.nccl_report)
    assert (report.world_size, report.backend) == (1, "nccl") and report.patterns


@pytest.mark.gpu
@needs_gpu
def test_a_training_segment_runs_fp8_on_the_gpu_through_the_stage(tmp_path, fixed_tokens):
    summary = run_segment(tmp_path, fixed_tokens, *GPU_RUN)
    fp8 = summary["setup"]["fp8"]
    print(f"fp8 backend: {fp8['reason']}")
    losses = [s["loss"] for s in summary["steps"]]
    assert fp8["backend"] != "reference" and all(math.isfinite(x) for x in losses) and losses[-1] < losses[0]
