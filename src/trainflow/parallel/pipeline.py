"""Pipeline parallel: split the decoder by layer into stages and drive them with torch's schedules.

Stage s of n = pp * virtual_stages owns layers [s * L/n, (s+1) * L/n). With virtual stages, rank r
owns stages r, r + pp, r + 2 pp, ... (the loop placement ScheduleInterleaved1F1B expects), which
cuts the bubble from (p-1)/(m+p-1) to (p-1)/(v*m+p-1).

A head tied to the embedding (model.tie_embeddings) is split as Megatron splits it: the first stage's embedding and
the last stage's head are two copies of one weight, equal at the split (both are the model's one Parameter,
deep-copied), kept equal by summing their gradients after every backward (TiedEmbedding, over a group of each
pipeline's first and last rank), so both take the same optimizer step.
"""

from __future__ import annotations

import copy
from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.pipelining import PipelineStage, Schedule1F1B, ScheduleGPipe, ScheduleInterleaved1F1B

from trainflow.config.layout import ParallelDims
from trainflow.tensors import local

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


@dataclass
class TiedEmbedding:
    """This rank's copies of a tied embedding / head weight (the first stage's embedding, the last stage's head:
    either, or both on one rank of interleaved stages) and the group of its pipeline's two ends."""

    embedding: nn.Parameter | None
    head: nn.Parameter | None
    """The copy a gradient norm leaves out: the embedding counts the weight once."""
    group: dist.ProcessGroup

    def sum_grads(self) -> None:
        """Sum both ends' gradients of the tied weight into each (a DTensor's local shard: both ends shard it alike
        over dp and tp)."""
        grads = [local(w.grad) for w in (self.embedding, self.head) if w is not None and w.grad is not None]
        total = torch.stack(grads).sum(0) if len(grads) > 1 else grads[0]
        dist.all_reduce(total, group=self.group)
        for g in grads:
            g.copy_(total)


def tie_embeddings(parts: list[nn.Module], mesh: DeviceMesh) -> TiedEmbedding | None:
    """The tied weight's copies on this rank and a group of the two ends of its pipeline; None on a middle rank.
    Every rank takes part in making the groups."""
    pp_dim = mesh.mesh_dim_names.index("pp")
    ranks = mesh.mesh.movedim(pp_dim, -1).reshape(-1, mesh.mesh.shape[pp_dim])  # one row per pipeline
    group, _ = dist.new_subgroups_by_enumeration(ranks[:, [0, -1]].tolist())
    embedding = next((p.tok_embeddings.weight for p in parts if p.tok_embeddings is not None), None)
    head = next((p.output.weight for p in parts if p.output is not None), None)
    return TiedEmbedding(embedding, head, group) if embedding is not None or head is not None else None
