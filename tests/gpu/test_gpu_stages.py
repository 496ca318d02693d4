"""The real stage modules on one CUDA GPU over NCCL: the gate (trainflow.stages.validate_nccl) in a one-rank NCCL
world, the gate's pattern code in a one-rank group of either backend, and a short fp8 training segment
(trainflow.stages.train_segment, its ranks started by submitit as in a campaign). Skipped without a GPU, except the
check that their overrides compose and the pattern code on gloo.

    .venv/bin/python -m pytest tests/gpu/test_gpu_stages.py -q -rA      # scripts/gpu_check.sh runs it

Why the first GPU run (2026-12-04) failed two of these, read from the code: in a one-rank world the gate's job times
no pattern and no sweep (trainflow.launch.gate_job runs them only where world > 1, and a layout whose every group is
one rank has no pattern: trainflow.gate.patterns.patterns_of), so `report.patterns` was empty and the bare assert
failed; the test now asserts what one GPU shows, and the patterns' own code runs in a one-rank group below. The
segment: training reduces CPU tensors over the default group (trainflow.train.controls.StopFlag.agreed after every
step, trainflow.checkpoint.manager.newest_complete at the segment's start), which an NCCL group refuses ("No backend
type associated with device type cpu": a group initialised as "cuda:gloo", which serves CUDA tensors only as NCCL's
does, raises it here on CPU too). The fix lies in those two modules (a tensor on the rank's device); until it lands
this test fails, and says so. Every assertion here says what it saw; a failed segment's message carries the ranks'
log lines.
"""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import torch
import torch.distributed as dist

from tests.conftest import make_config, run_segment
from trainflow.gate.patterns import PATTERNS, Pattern, sweep, time_pattern
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
def test_the_gate_passes_a_one_gpu_nccl_world_with_no_pattern_to_time(tmp_path, fixed_tokens):
    cfg = make_config("validate_nccl", tmp_path, *GPU_RUN, tokens=fixed_tokens)
    validate_nccl.run(cfg)
    report = read_record(NcclReport, cfg.io.nccl_report)
    seen = f"world {report.world_size}, {report.backend}, sweep {report.sweep}, patterns {report.patterns}"
    assert (report.world_size, report.backend) == (1, "nccl"), seen
    assert report.sweep == [] and report.patterns == [], f"one rank has no group of two to time: {seen}"
    assert report.calibration.constants, f"the compute probe ran on the GPU: {report.calibration}"


ONE_RANK_OPS = sorted({p.op for p in PATTERNS.values()} - {"send_recv"})  # a rank cannot send to itself


@pytest.mark.parametrize(
    "backend",
    ["gloo", pytest.param("nccl", marks=[pytest.mark.gpu, needs_gpu])],
)
def test_the_gate_s_patterns_run_in_a_one_rank_group(tmp_path, backend):
    """Each collective the gate times (all_reduce, reduce_scatter, all_gather) and its sweep's check of the sum, in
    a one-rank group: what one GPU can show of the gate's code over NCCL."""
    device = torch.device("cuda" if backend == "nccl" else "cpu")
    store = dist.FileStore(str(tmp_path / "store"), 1)
    dist.init_process_group(backend, store=store, rank=0, world_size=1, device_id=device if backend == "nccl" else None)
    try:
        timed = {}
        for op in ONE_RANK_OPS:
            pattern = Pattern("world", op)
            seconds, size, whole = time_pattern(pattern, dist.group.WORLD, nbytes=1 << 16, iters=3, device=device)
            timed[op] = (seconds, size, whole.device.type, whole.sum().item())
        rows = sweep([0.0625], iters=3, device=device)
    finally:
        dist.destroy_process_group()
    for op, (seconds, size, where, total) in timed.items():
        assert seconds > 0 and size == 1 << 16 and where == device.type, f"{op} on {backend}: {timed[op]}"
        assert total == (1 << 14), f"{op}: one rank's buffer of ones came back summing to {total}"
    assert len(rows) == 1 and rows[0].busbw_gbps == 0, f"one rank moves no bytes on a bus: {rows}"


def rank_logs(root: Path) -> str:
    """The last lines of every rank's log under `root` (submitit's .err and .out files)."""
    lines = [f"{p}: {line}" for p in sorted(root.rglob("*_log.*")) for line in p.read_text().splitlines()[-15:]]
    return "\n".join(lines[-60:])


@pytest.mark.gpu
@needs_gpu
def test_a_training_segment_runs_fp8_on_the_gpu_through_the_stage(tmp_path, fixed_tokens):
    try:
        summary = run_segment(tmp_path, fixed_tokens, *GPU_RUN)
    except Exception as err:
        pytest.fail(f"the segment failed: {type(err).__name__}: {err}\n{rank_logs(tmp_path)}")
    fp8 = summary["setup"]["fp8"]
    losses = [s["loss"] for s in summary["steps"]]
    seen = f"backend {fp8['backend']} ({fp8['reason']}), losses {losses}"
    assert fp8["backend"] not in ("reference", None), seen
    assert len(losses) == 6 and all(math.isfinite(x) for x in losses), seen
    assert losses[-1] < losses[0], f"the loss did not fall over 6 steps: {seen}"
