"""The collectives of one training step, every pipeline rank's, timed once from the setup's groups
(trainflow.plan.collectives): tp's all-reduces inside the blocks and at the vocab-parallel ends, cp's K and V gathers,
the activations sent between stages and the dp gradient reduction, in total and exposed. plan.step takes them into
its split; its module docstring says what each one moves.

    python -c "from trainflow.config import compose; from trainflow.plan.setup import plan_setup; \
        from trainflow.plan.step import plan_step; cfg = compose('train_segment', ['experiment=llama70b_alps']); \
        print(plan_step(cfg, plan_setup(cfg)).dp_seconds)"
"""

from __future__ import annotations

from dataclasses import dataclass

from trainflow.config.schema import ClusterConfig, ModelConfig
from trainflow.plan.memory import FP32
from trainflow.plan.setup import PlanSetup

TP_FORWARD, TP_BACKWARD = 2, 5
"""All-reduces per block on the tp group: RowwiseParallel's wo and w2 forward, the five ColwiseParallel
linears' input gradients backward (counted with torch's CommDebugMode on torch 2.13)."""
ENDS_FORWARD, ENDS_BACKWARD = 2, 1
"""Collectives of the vocab-parallel ends on the tp group (trainflow.parallel.tensor_parallel, counted the same way):
forward the embedding's all-reduce (first pipeline rank) and the logits' all-gather (last), backward the head's
input-gradient all-reduce (last)."""


@dataclass(frozen=True)
class RankComms:
    """One pipeline rank's collectives: per microbatch (tp, cp) and per step (dp, activation)."""

    tp: float
    """The blocks' all-reduces and those of the ends this rank holds."""
    cp: float
    dp_total: float
    """The whole gradient reduction, before overlap."""
    dp_exposed: float


@dataclass(frozen=True)
class StepComms:
    activation: float
    """The exchanges between pipeline stages of one step (the same on every rank)."""
    ranks: list[RankComms]


def step_comms(
    m: ModelConfig,
    setup: PlanSetup,
    cluster: ClusterConfig,
    computes: list[tuple[float, float]],
    *,
    tokens: int,
    compute_bytes: int,
    bucket_mb: float,
    overlap: bool,
) -> StepComms:
    """Every pipeline rank's collectives, given its microbatch's compute and the backward's share of it (`computes`)."""
    dims, groups, hw = setup.layout, setup.groups, cluster.hardware
    recompute = setup.activations == "recompute"
    layers, mb = m.n_layers // dims.pp, dims.microbatches
    activation_bytes = tokens * m.dim
    tp_backward = groups.tp.allreduce_s(activation_bytes * FP32)
    tp_s = layers * (
        (TP_FORWARD * (2 if recompute else 1)) * groups.tp.allreduce_s(activation_bytes * compute_bytes)
        + TP_BACKWARD * tp_backward
    )
    # Outside the blocks, so recompute repeats none of them: the embedding's rows summed in fp32 (its output and the
    # residual stream's dtype), the (b T, vocab) logits gathered in the compute dtype, and the head's fp32 input
    # gradient summed as a block's.
    embedding_s = groups.tp.allreduce_s(activation_bytes * FP32)
    head_s = groups.tp.shard_s(tokens * m.vocab_size * compute_bytes) + ENDS_BACKWARD * tp_backward
    # The whole sequence's K and V (b T = tokens x cp), gathered forward (twice under recompute), scattered backward.
    kv_bytes = tokens * dims.cp * 2 * m.n_kv_heads * m.head_dim // dims.tp * compute_bytes
    cp_s = layers * ((2 if recompute else 1) + 1) * groups.cp.shard_s(kv_bytes)
    exchanges = 2 * dims.virtual_stages * mb if dims.pp_enabled else 0
    activation = exchanges * groups.pp.link.seconds(tokens * m.dim * FP32)
    ranks = []
    for rank, (compute, backward_compute) in enumerate(computes):
        first, last = rank == 0, rank == dims.pp - 1
        params = setup.counts.stage_params[rank]
        tp = tp_s + first * embedding_s + last * head_s
        if dims.fsdp_enabled:
            dp_total = groups.sharded_s(
                gradient_bytes=params * FP32, weight_bytes=params * compute_bytes, gathers=1 if dims.pp_enabled else 2
            )
            window = mb * (compute + tp + cp_s)
            dp_exposed = dp_total if dims.pp_enabled else max(0.0, dp_total - hw.overlap_fraction * window)
        else:
            backward = backward_compute + (layers * TP_BACKWARD + last * ENDS_BACKWARD) * tp_backward
            hidden = hw.overlap_fraction * backward if dims.pp == 1 and overlap and dims.dp > 1 else None
            dp_total, dp_exposed = groups.dp.overlapped_allreduce_s(
                params * FP32, bucket_bytes=bucket_mb * 2**20, hidden=hidden
            )
        ranks.append(RankComms(tp=tp, cp=cp_s, dp_total=dp_total, dp_exposed=dp_exposed))
    return StepComms(activation=activation, ranks=ranks)
