"""Where one training step's seconds go, predicted from the model's shape, the layout and the cluster's links.

    python -c "from trainflow.config import compose; from trainflow.plan.setup import plan_setup; \
        from trainflow.plan.step import plan_step; cfg = compose('train_segment', ['experiment=llama70b_alps']); \
        print(plan_step(cfg, plan_setup(cfg)).split)"

The step as trainflow runs it (trainflow.parallel.runtime), per pipeline rank r, with m microbatches of
b sequences of T tokens, v chunks per rank and p ranks in the pipeline:

- compute: FLOPs / (cluster.hardware.peak_tflops x matmul_efficiency). Forward FLOPs per token are 2 per
  matmul weight the rank holds (tensor parallel splits the block linears, and the output head by vocabulary
  row: trainflow.parallel.tensor_parallel) plus attention's 4 T d / tp (QK^T and
  AV over the full T x T, as trainflow.config.shape counts them); backward is twice forward and
  activations=recompute runs the blocks' forward once more. FP8 divides the block linears' time by
  cluster.hardware.fp8_speedup (attention and the head stay bf16).
- tp: the all-reduces inside a block, over the tp group, not overlapped: forward, RowwiseParallel's two
  (wo, w2) of b T d elements in the compute dtype; backward, one per ColwiseParallel linear (wq, wk, wv,
  w1, w3: five, where Megatron fuses to two), of the fp32 gradient of the norm's output, which enters the
  linear before autocast casts it; recompute repeats the forward two. And the vocab-parallel ends', which
  recompute does not repeat: on the first rank the embedding's all-reduce of its b T d fp32 output; on the last
  the all-gather of the b T x vocab logits in the compute dtype and the all-reduce of the head's fp32 input
  gradient (plan.step_comms, where every collective is timed).
- cp: context parallel's K and V, all-gathered over the cp group in every layer's forward (again under recompute)
  and reduce-scattered in its backward, b T (the whole sequence) x 2 n_kv_heads head_dim / tp elements in the
  compute dtype each, not overlapped (parallel.context gathers right where attention needs them). Under cp a rank
  holds b T / cp tokens of each microbatch, and the compute, tp and activation terms count those; attention's
  FLOPs per token stay 4 T d / tp (each local query against all T keys, the dense mask parallel.context runs).
- bubble: the schedule's idle time. The busiest rank's per-microbatch work W_max sets the pace: the
  schedule lasts (m + (p-1)/v) W_max plus the exchanges, so the busiest rank idles (p-1)/v W_max, a
  (p-1)/(v m + p-1) share of the schedule (Narayanan et al. 2021); GPipe and 1F1B have v = 1. A lighter
  rank idles also for the difference (m (W_max - W_r)): the imbalance of a pipeline whose last stage holds
  the output head.
- activation: 2 v m exchanges per rank (each chunk sends an activation forward and receives a gradient
  back per microbatch; trainflow.parallel.timing counts them the same way), b T d fp32 each (the residual
  stream stays fp32 between stages), over the pp link, exposed.
- dp: the gradient all-reduce of the rank's fp32 gradients over the dp group in parallel.bucket_mb
  buckets (ring or tree, trainflow.plan.collectives). Hidden behind backward only without a pipeline and
  with parallel.overlap: up to cluster.hardware.overlap_fraction of the backward, never the last bucket, which
  fills as backward ends. Under a pipeline trainflow's GradReducer launches the buckets after the schedule
  (its docstring), so all of it is exposed. dp_mode=shard: FSDP's reduce-scatter of fp32 gradients and
  all-gathers of the compute-dtype parameters (forward and backward; once under a pipeline, which keeps
  the stage gathered) over the shard group, plus HSDP's all-reduce of the shard over the replicas; hidden
  up to overlap_fraction of the forward and backward without a pipeline, exposed under one.
- optimizer: AdamW and gradient clipping, memory-bound: OPTIMIZER_BYTES per parameter held at
  cluster.hardware.memory_gbps.

The step lasts as long as its slowest rank; `split` is that rank's, `per_pp_rank` every pipeline rank's.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

from trainflow.config.schema import PRECISIONS, ClusterConfig, ModelConfig, TrainflowConfig
from trainflow.config.shape import mfu
from trainflow.plan.setup import PlanSetup
from trainflow.plan.step_comms import step_comms
from trainflow.records import Record

OPTIMIZER_BYTES = 40
"""Bytes AdamW and clipping move per parameter: read weight, gradient and two moments and write three back
(28), read the gradients for the norm and scale them (12)."""


@dataclass(frozen=True)
class StepSplit(Record):
    """Seconds of one step on one pipeline rank, by part."""

    compute: float
    tp: float
    bubble: float
    activation: float
    dp: float
    """Exposed data-parallel communication."""
    optimizer: float
    cp: float = 0.0
    """Context parallel's K and V all-gathers and their backward reduce-scatters (0 without cp)."""

    @property
    def total(self) -> float:
        return self.compute + self.tp + self.bubble + self.activation + self.dp + self.optimizer + self.cp

    def shares(self) -> dict[str, float]:
        return {k: v / self.total for k, v in asdict(self).items()}


@dataclass(frozen=True)
class StepPlan(Record):
    split: StepSplit
    """The slowest pipeline rank's (the step's length)."""
    per_pp_rank: list[StepSplit]
    step_s: float
    tokens_per_s_per_device: float
    mfu: float
    flops_per_token: float
    """The model's training FLOPs per token (trainflow.config.shape), what MFU divides by."""
    dp_seconds: float
    """The whole gradient reduction of the slowest rank, before overlap."""
    bubble_fraction: float
    """(p-1)/(v m + p-1): the schedule's idle share on its busiest rank."""


def plan_step(cfg: TrainflowConfig, setup: PlanSetup, *, fp8: bool = False) -> StepPlan:
    """The step of a composed config's setup, its block linears at cluster.hardware.fp8_speedup where train.fp8 is on
    (or `fp8`: the planner's FP8 remedy)."""
    p = cfg.parallel
    fp8 = fp8 or cfg.train.fp8 != "none"
    return step_plan(cfg.model, setup, cfg.cluster, bucket_mb=p.bucket_mb, overlap=p.overlap, fp8=fp8)


def step_plan(
    m: ModelConfig, setup: PlanSetup, cluster: ClusterConfig, *, bucket_mb: float, overlap: bool, fp8: bool = False
) -> StepPlan:
    """The step split of every pipeline rank (module docstring)."""
    dims = setup.layout
    p, v, mb = dims.pp, dims.virtual_stages, dims.microbatches
    tokens = setup.microbatch_size * m.seq_len // dims.cp  # this rank's share of a microbatch
    computes = _microbatch_compute(m, setup, cluster, tokens=tokens, fp8=fp8)
    splits, dp_totals = _rank_splits(
        m,
        setup,
        cluster,
        computes,
        tokens=tokens,
        compute_bytes=PRECISIONS[setup.precision].bytes,
        bucket_mb=bucket_mb,
        overlap=overlap,
    )
    worst = max(range(p), key=lambda r: splits[r].total)
    slowest = splits[worst]
    tokens_per_device = dims.dp * dims.cp * mb * tokens / slowest.total / dims.world_size
    return StepPlan(
        split=slowest,
        per_pp_rank=splits,
        step_s=slowest.total,
        tokens_per_s_per_device=tokens_per_device,
        mfu=mfu(m, tokens_per_device, peak_tflops=cluster.hardware.peak_tflops),
        flops_per_token=setup.counts.flops_per_token,
        dp_seconds=dp_totals[worst],
        bubble_fraction=(p - 1) / (v * mb + p - 1),
    )


def _rank_splits(
    m: ModelConfig,
    setup: PlanSetup,
    cluster: ClusterConfig,
    computes: list[tuple[float, float]],
    *,
    tokens: int,
    compute_bytes: int,
    bucket_mb: float,
    overlap: bool,
) -> tuple[list[StepSplit], list[float]]:
    """Each pipeline rank's split of the step, and its whole dp communication before overlap: its compute and its
    collectives (plan.step_comms) against the schedule the busiest rank paces."""
    dims = setup.layout
    p, v, mb = dims.pp, dims.virtual_stages, dims.microbatches
    comms = step_comms(
        m, setup, cluster, computes, tokens=tokens, compute_bytes=compute_bytes, bucket_mb=bucket_mb, overlap=overlap
    )
    activation = comms.activation
    w_max = max(c + r.tp + r.cp for (c, _), r in zip(computes, comms.ranks, strict=True))
    schedule = (mb + (p - 1) / v) * w_max + activation
    splits = []
    for rank, ((compute, _), r) in enumerate(zip(computes, comms.ranks, strict=True)):
        held = (
            -(-setup.counts.stage_params[rank] // dims.shard_ranks)
            if dims.fsdp_enabled
            else setup.counts.stage_params[rank]
        )
        splits.append(
            StepSplit(
                compute=mb * compute,
                tp=mb * r.tp,
                bubble=schedule - activation - mb * (compute + r.tp + r.cp),
                activation=activation,
                dp=r.dp_exposed,
                optimizer=held * OPTIMIZER_BYTES / (cluster.hardware.memory_gbps * 1e9),
                cp=mb * r.cp,
            )
        )
    return splits, [r.dp_total for r in comms.ranks]


def _microbatch_compute(
    m: ModelConfig, setup: PlanSetup, cluster: ClusterConfig, *, tokens: int, fp8: bool
) -> list[tuple[float, float]]:
    """Per pipeline rank, one microbatch's compute and the backward's share of it."""
    hw, p = cluster.hardware, setup.layout.pp
    recompute = setup.activations == "recompute"
    flops_s = hw.peak_tflops * 1e12 * hw.matmul_efficiency
    linear_s = flops_s * (hw.fp8_speedup if fp8 else 1.0)
    layers = m.n_layers // p
    linear_flops, attention_flops = setup.counts.block_linear_flops, setup.counts.block_attention_flops
    passes = 4 if recompute else 3  # forward, backward (2x), and the recomputed forward
    block_linear_s = layers * tokens * linear_flops / linear_s
    block_attention_s = layers * tokens * attention_flops / flops_s
    head_s = tokens * 2 * setup.counts.output_params / flops_s

    def work(rank: int) -> tuple[float, float]:
        last = rank == p - 1
        compute = passes * (block_linear_s + block_attention_s) + last * 3 * head_s
        return compute, 2 * (block_linear_s + block_attention_s + last * head_s)

    return [work(r) for r in range(p)]
