"""What the plan is of, resolved once from the config: the checked layout, sequences per microbatch, ranks per node and
each group's link. build_plan makes it and passes it to every part of the plan (memory, step, campaign, goodput,
remedies, seed), which read it instead of deriving it again; the gate's calibration does the same.

    python -c "from trainflow.config import compose; from trainflow.plan.setup import plan_setup; \
        print(plan_setup(compose('train_segment', ['experiment=llama70b_alps'])).links.tp)"
"""

from __future__ import annotations

from dataclasses import dataclass

from trainflow.config.layout import ParallelDims
from trainflow.config.schema import ClusterConfig, ModelConfig, TrainflowConfig
from trainflow.plan.collectives import GroupLinks, group_links
from trainflow.records import Record


@dataclass(frozen=True)
class PlanSetup(Record):
    """What the plan is of: the model, the layout, the batch and how a step computes, on which cluster preset."""

    model: str
    layout: ParallelDims
    microbatch_size: int
    """Sequences per microbatch: train.global_batch / (dp x microbatches)."""
    ranks_per_node: int
    """world_size / cluster.allocation.nodes (at least 1)."""
    links: GroupLinks
    """Each group's link on this cluster (trainflow.plan.collectives)."""
    global_batch: int
    seq_len: int
    precision: str
    activations: str
    cluster: str


def plan_setup(cfg: TrainflowConfig) -> PlanSetup:
    """cfg's setup, its layout checked as training checks it (ConfigError naming the rule it breaks)."""
    t = cfg.train
    dims = ParallelDims.from_config(
        cfg.parallel, cfg.model, world_size=cfg.parallel.world_size, global_batch=t.global_batch
    )
    return layout_setup(
        cfg.model, dims, cfg.cluster, global_batch=t.global_batch, precision=t.precision, activations=t.activations
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
        links=group_links(cluster.hardware, dims, ranks_per_node=ranks_per_node),
        global_batch=global_batch,
        seq_len=m.seq_len,
        precision=precision,
        activations=activations,
        cluster=cluster.name,
    )
