"""Pipeline parallel: split the decoder by layer into stages and drive them with torch's schedules.

Stage s of n = pp * virtual_stages owns layers [s * L/n, (s+1) * L/n). With virtual stages, rank r
owns stages r, r + pp, r + 2 pp, ... (the loop placement ScheduleInterleaved1F1B expects), which
cuts the bubble from (p-1)/(m+p-1) to (p-1)/(v*m+p-1).
"""

from __future__ import annotations

import copy
from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch import nn
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.pipelining import PipelineStage, Schedule1F1B, ScheduleGPipe, ScheduleInterleaved1F1B

from trainflow.config.layout import ParallelDims

# torch's schedule for each single-chunk name of config.SCHEDULES (interleaved_1f1b takes several chunks)
SCHEDULE_CLASSES = {"gpipe": ScheduleGPipe, "1f1b": Schedule1F1B}


@dataclass
class StageInfo:
    stage: PipelineStage
    is_first: bool
    is_last: bool


def stage_ids(pp_rank: int, dims: ParallelDims) -> list[int]:
    return [pp_rank + v * dims.pp for v in range(dims.virtual_stages)]


def split_model(model: nn.Module, stage: int, n_stages: int) -> nn.Module:
    """A copy of `model` holding only the layers of `stage` (and the embeddings / head at the ends)."""
    chunk = copy.deepcopy(model)
    per = model.n_layers // n_stages
    keep = {str(i) for i in range(stage * per, (stage + 1) * per)}
    for name in list(chunk.layers):
        if name not in keep:
            del chunk.layers[name]
    if stage != 0:
        chunk.tok_embeddings = None
    if stage != n_stages - 1:
        chunk.norm = chunk.output = None
    return chunk


def pipeline_model(
    model: nn.Module, *, dims: ParallelDims, pp_mesh: DeviceMesh, device: torch.device
) -> tuple[list[StageInfo], list[nn.Module]]:
    """This rank's pipeline stages and their model chunks."""
    group, rank = pp_mesh.get_group(), pp_mesh.get_local_rank()
    stages, parts = [], []
    for s in stage_ids(rank, dims):
        chunk = split_model(model, s, dims.n_stages)
        stages.append(
            StageInfo(PipelineStage(chunk, s, dims.n_stages, device, group=group), s == 0, s == dims.n_stages - 1)
        )
        parts.append(chunk)
    return stages, parts


def build_schedule(stages: list[StageInfo], *, dims: ParallelDims, loss_fn: Callable) -> object:
    """GPipe, 1F1B or interleaved 1F1B over this rank's stages; gradients averaged over microbatches."""
    if dims.schedule == "interleaved_1f1b":
        return ScheduleInterleaved1F1B([s.stage for s in stages], n_microbatches=dims.microbatches, loss_fn=loss_fn)
    (only,) = stages
    return SCHEDULE_CLASSES[dims.schedule](only.stage, n_microbatches=dims.microbatches, loss_fn=loss_fn)
