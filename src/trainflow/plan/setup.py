"""What the plan is of, resolved once from the config: the checked layout, sequences per microbatch, ranks per node,
the model's counts on one rank of the layout and each group (its size, link and all-reduce algorithm). build_plan
makes it and passes it to every part of the plan (memory, step, campaign, goodput, remedies, seed), which read it
instead of deriving it again; the gate's calibration does the same.

    python -c "from trainflow.config import compose; from trainflow.plan.setup import plan_setup; \
        print(plan_setup(compose('train_segment', ['experiment=llama70b_alps'])).groups.tp)"
"""

from __future__ import annotations

from dataclasses import dataclass

from trainflow.config.layout import ParallelDims
from trainflow.config.schema import ClusterConfig, ModelConfig, TrainflowConfig
from trainflow.config.shape import (
    block_flops_per_token,
    block_params,
    embedding_params,
    flops_per_token,
    head_params,
    linear_params,
    output_params,
    stage_params,
    total_params,
)
from trainflow.plan.collectives import MeshGroups, mesh_groups
from trainflow.records import Record


@dataclass(frozen=True)
class ModelCounts(Record):
    """The model's counts on one tp rank of the layout (trainflow.config.shape, their one home), resolved once."""

    stage_params: list[int]
    """Parameters of each pipeline rank."""
    block_params: int
    linear_params: int
    """One block's linears."""
    embedding_params: int
    output_params: int
    """The output head's weight (a matmul, tied or not)."""
    head_params: int
    """The final norm and the head as the last pipeline stage holds them."""
    total_params: int
    """The whole model's, unsplit."""
    block_linear_flops: float
    block_attention_flops: float
    """Forward FLOPs per token of one block's linears and of its attention."""
    flops_per_token: float
    """The whole model's training FLOPs per token: what MFU divides by."""


@dataclass(frozen=True)
class PlanSetup(Record):
    """What the plan is of: the model, the layout, the batch and how a step computes, on which cluster preset."""

    model: str
    layout: ParallelDims
    microbatch_size: int
    """Sequences per microbatch: train.global_batch / (dp x microbatches)."""
    ranks_per_node: int
    """world_size / cluster.allocation.nodes (at least 1)."""
    counts: ModelCounts
    groups: MeshGroups
    """Each group's size, link on this cluster and all-reduce algorithm (trainflow.plan.collectives)."""
    global_batch: int
    seq_len: int
    precision: str
    activations: str
    cluster: str


def plan_setup(cfg: TrainflowConfig) -> PlanSetup:
    """cfg's setup, its layout checked as training checks it (ConfigError naming the rule it breaks)."""
    t = cfg.train
    return layout_setup(
        cfg.model,
        ParallelDims.from_config(
            cfg.parallel, cfg.model, world_size=cfg.parallel.world_size, global_batch=t.global_batch
        ),
        cfg.cluster,
        global_batch=t.global_batch,
        precision=t.precision,
        activations=t.activations,
    )


def layout_setup(
    m: ModelConfig, dims: ParallelDims, cluster: ClusterConfig, *, global_batch: int, precision: str, activations: str
) -> PlanSetup:
    """The setup of a layout already checked (plan_setup checks a config's)."""
    ranks_per_node = max(1, dims.world_size // cluster.allocation.nodes)
    return PlanSetup(
        model=m.name,
        layout=dims,
        microbatch_size=dims.microbatch_size(global_batch),
        ranks_per_node=ranks_per_node,
        counts=model_counts(m, dims),
        groups=mesh_groups(cluster.hardware, dims, ranks_per_node=ranks_per_node),
        global_batch=global_batch,
        seq_len=m.seq_len,
        precision=precision,
        activations=activations,
        cluster=cluster.name,
    )


def model_counts(m: ModelConfig, dims: ParallelDims) -> ModelCounts:
    """m's counts on one tp rank of dims."""
    tp, pp = dims.tp, dims.pp
    linear_flops, attention_flops = block_flops_per_token(m, tp=tp)
    return ModelCounts(
        stage_params=[stage_params(m, pp_rank=r, pp=pp, tp=tp) for r in range(pp)],
        block_params=block_params(m, tp=tp),
        linear_params=linear_params(m, tp=tp),
        embedding_params=embedding_params(m, tp=tp),
        output_params=output_params(m, tp=tp),
        head_params=head_params(m, pp=pp, tp=tp),
        total_params=total_params(m),
        block_linear_flops=linear_flops,
        block_attention_flops=attention_flops,
        flops_per_token=flops_per_token(m),
    )
