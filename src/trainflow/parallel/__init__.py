"""Hybrid parallelism applied to the single-device Llama decoder, torchtitan style.

    parallelize_model(model, dims, mesh, ...) -> Parallelized

Fixed order: pipeline split (`pipeline_model`, pipeline.py) -> tensor parallel on each chunk (`apply_tp`,
tensor_parallel.py) -> data parallel (`apply_dp`, data_parallel.py: `apply_ddp` on a 1-D mesh, else
`GradReducer`). runtime.py holds `parallelize_model` and the `Parallelized` steps; timing.py splits a step's
time. Everything is PyTorch's own API (DeviceMesh, DTensor parallel styles, torch.distributed.pipelining,
DDP) except the bucketed gradient all-reduce for 2-D/3-D meshes, which DDP cannot do (see grad_reducer.py).
This module only re-exports the public names.
"""

from trainflow.config.layout import ParallelDims
from trainflow.parallel.data_parallel import apply_ddp, apply_dp
from trainflow.parallel.grad_reducer import GradReducer
from trainflow.parallel.pipeline import build_schedule, pipeline_model
from trainflow.parallel.runtime import Parallelized, parallelize_model
from trainflow.parallel.tensor_parallel import TP_PLAN, apply_tp
from trainflow.parallel.timing import PipelineClock, StepTimes, add_compute_timers, probe_exchange_seconds

__all__ = [
    "TP_PLAN",
    "GradReducer",
    "ParallelDims",
    "Parallelized",
    "PipelineClock",
    "StepTimes",
    "add_compute_timers",
    "apply_ddp",
    "apply_dp",
    "apply_tp",
    "build_schedule",
    "parallelize_model",
    "pipeline_model",
    "probe_exchange_seconds",
]
