"""Bytes one device holds at the peak of a training step, from the model's shape alone (no torch).

    python -c "from trainflow.config import compose, ParallelDims; from trainflow.plan.memory import device_memory; \
        from trainflow.plan.setup import model_counts; m = compose('train_segment', ['model=llama3_8b']).model; \
        d = ParallelDims(1, 8, 4, 32, microbatches=8); print(device_memory(m, d, counts=model_counts(m, d), \
        microbatch_size=1, precision='bf16', activations='recompute'))"

The state is fp32 in both precisions: master weights, gradients and AdamW's two moments (bf16 is autocast:
nothing is stored in it but what autograd saves). Replicated data parallel keeps all of it on every rank, sharded
(FSDP2, parallel.dp_mode=shard) a 1/shard of it, padded to whole rows. Tensor parallel splits the block linears and the
embedding and head by vocabulary row (config.shape.vocab_rows; not counted: the transient whole embedding gradient each
tp rank makes before parallel.tensor_parallel's hook keeps its rows); pipeline parallel gives each rank n_layers / pp
layers, the embedding to the first rank, the final norm and output head to the last. The estimate is the worst rank's.

`gathered` is what FSDP holds unsharded beside its shards, in the compute dtype (fsdp_gathered), as torch's
fully_shard and PipelineStage keep it: without a pipeline the blocks and the root unit (embedding, final norm, head)
are resharded after forward, and the peak is the root beside a block's backward working set; under a pipeline
nothing is resharded until the schedule's last backward, so the whole stage stays gathered and its gradients
accumulate unsharded in fp32. FSDP's mixed precision replaces autocast, so there are no weight copies then.

Activations are the tensors autograd saves for backward, per token, as this model saves them (block_saved: the
norms' inputs and 1 / rms, the linears' inputs, SDPA's q, k, v, output and logsumexp, SwiGLU's four tensors; under
bf16 the norms and residual stream stay fp32 and each matmul saves its own bf16 cast of its input), plus the
transients at the step's peak (block_transient, head_transient). tests/unit/test_memory.py holds the estimate
against the step's peak measured with torch's profiler. `weight_copies` are the bf16 casts of the matmul weights
that autocast caches for as long as its context lasts (a pipeline's whole schedule). Without sequence parallelism the
norms' and residual stream's tensors are whole on every tp rank: that, not attention or the MLP, is what tp leaves
to recompute or offload.

Activation modes (trainflow.train.activations, block_kept_and_live): keep, every layer's saved tensors; recompute,
each layer keeps its input and one block is rebuilt during its backward; offload (to a folder, or to host memory
from a CUDA device), next to nothing kept and the running block's working set live; offload to host memory on a CPU
device is keep's (host memory is the device's memory).

A pipeline multiplies the stored activations by the chunk-microbatches a rank holds at once (chunks_in_flight, per
torch's schedules; Narayanan et al. 2021, Korthikanti et al. 2022 section 4.2.3): GPipe all m, 1F1B min(m, pp - r)
on rank r, interleaved 1F1B its warm-up forwards plus one. The last rank's head holds m microbatches under GPipe, one
otherwise.

Not counted: buffers (RoPE tables), allocator fragmentation, the optimizer step's temporaries (on a CPU, foreach
AdamW's fp32 copy of the rank's parameters) and torch's DDP buckets on a pure-dp mesh. Gradients are counted whole
although zero_grad frees them between steps: under a pipeline they coexist with later microbatches' activations.
"""

from __future__ import annotations

from dataclasses import dataclass

from trainflow.config.layout import ParallelDims
from trainflow.config.schema import PRECISIONS, ModelConfig, TrainflowConfig
from trainflow.errors import ConfigError
from trainflow.plan.setup import ModelCounts, PlanSetup
from trainflow.records import Record

FP32, BF16 = 4, 2
INDEX = 8
"""Bytes of an int64 token id or target."""


@dataclass(frozen=True)
class MemoryEstimate(Record):
    """Bytes one device holds at the peak of a training step, by kind: the worst pipeline rank's."""

    parameters: int
    """fp32 master weights."""
    gradients: int
    """fp32, one per parameter."""
    optimizer_state: int
    """AdamW's two fp32 moments per parameter."""
    weight_copies: int
    """bf16 casts of the matmul weights that autocast caches and autograd saves (0 under fp32)."""
    activations: int
    """Saved tensors of the microbatches in flight, plus the transients at the step's peak."""
    gathered: int
    """What FSDP holds unsharded at the peak: parameters, gradients, collective buffers (0 when replicated)."""
    pp_rank: int
    """The pipeline rank these figures are for (0 without a pipeline)."""

    @property
    def total(self) -> int:
        return (
            self.parameters
            + self.gradients
            + self.optimizer_state
            + self.weight_copies
            + self.activations
            + self.gathered
        )


def block_saved(m: ModelConfig, *, tp: int, compute: int, cp: int = 1) -> int:
    """Bytes per token that autograd saves in one block. Under fp32 (d = dim, q = n_heads * head_dim / tp,
    f = ffn_dim / tp, h = n_heads / tp):

        each RMSNorm     input x, x / rms (before the weight), 1 / rms       2 * (2d + 1) * 4
        wq / wk / wv     their input, the norm's output (one tensor)         d * 4
        attention        SDPA's q, k, v (full query width), output, lse     4 * q * 4 + h * 4
        w1 / w3          their input, the MLP norm's output                   d * 4
        SwiGLU           w1 x, silu(w1 x), w3 x, their product               4 * f * 4

    Under bf16 the attention and SwiGLU tensors are bf16 and each matmul saves its own cast of its input (autocast
    caches casts of weights only): 3 copies of the attention norm's output, 2 of the MLP norm's. Under context
    parallel (per token the rank holds) SDPA saves q and its output as above but the whole sequence's gathered K and
    V at their own heads' width (parallel.context): 2 * cp * n_kv_heads * head_dim / tp."""
    d, q, f, heads = m.dim, m.n_heads * m.head_dim // tp, m.ffn_dim // tp, m.n_heads // tp
    norms = 2 * (2 * d + 1) * FP32
    norm_outputs = 2 * d * FP32 if compute == FP32 else 5 * d * compute  # bf16: one cast per matmul
    kv = 2 * q if cp == 1 else 2 * cp * m.n_kv_heads * m.head_dim // tp
    attention = (2 * q + kv) * compute + heads * FP32
    mlp = 4 * f * compute
    return norms + norm_outputs + attention + mlp


def block_transient(m: ModelConfig, *, tp: int, compute: int) -> int:
    """Bytes per token a block's backward holds beyond its saved tensors at its peak (SwiGLU's product)."""
    return m.dim * FP32 + 2 * (m.ffn_dim // tp) * compute


def offloaded_block_live(m: ModelConfig, *, tp: int, compute: int) -> int:
    """Bytes per token a block holds while it runs with its saved tensors offloaded.

    Forward, at SwiGLU's product: the block's input, the residual and the MLP norm's output (fp32) beside
    silu(w1 x), w3 x and the product; backward unpacks a node's tensors only when it runs, and holds at
    most the incoming gradient and four SwiGLU-width tensors (the product's gradient, two unpacked
    operands, one operand's gradient).
    """
    d, f = m.dim, m.ffn_dim // tp
    return max(3 * d * FP32 + 3 * f * compute, d * FP32 + 4 * f * compute)


def head_saved(m: ModelConfig, *, compute: int) -> int:
    """Bytes per token the final norm, output head and cross-entropy save."""
    return (2 * m.dim + 1) * FP32 + m.dim * compute + m.vocab_size * FP32 + INDEX


def head_transient(m: ModelConfig) -> int:
    """Bytes per token cross-entropy's backward holds beside the saved log-softmax."""
    return 2 * m.vocab_size * FP32


def block_kept_and_live(
    m: ModelConfig, *, tp: int, compute: int, activations: str, host: bool, device: str, cp: int = 1
) -> tuple[int, int]:
    """Bytes per token a block keeps for backward, and what the running block holds at its peak, per
    train.activations (the module docstring's list; `host`: offload to host memory, not to a folder)."""
    saved, transient = block_saved(m, tp=tp, compute=compute, cp=cp), block_transient(m, tp=tp, compute=compute)
    if activations == "keep" or (activations == "offload" and host and device == "cpu"):
        return saved, transient
    if activations == "recompute":
        return m.dim * FP32, saved - m.dim * FP32 + transient  # the rebuilt block, less its kept input
    return 0, offloaded_block_live(m, tp=tp, compute=compute)


def fsdp_gathered(counts: ModelCounts, dims: ParallelDims, rank: int, *, compute: int) -> int:
    """What FSDP holds unsharded on pipeline rank `rank` at the step's peak (the module docstring)."""
    params, block = counts.stage_params[rank], counts.block_params
    ends = (rank == 0) * counts.embedding_params + (rank == dims.pp - 1) * counts.head_params
    if dims.pp_enabled:  # the whole stage, its gradients unsharded in fp32, the last reduce-scatter's input
        return params * (compute + FP32) + max(block, ends) * FP32
    at_work = (3 * block + counts.head_params) * compute + block * FP32  # the root beside the blocks at work
    return ends * compute + max(ends * compute, at_work)


def chunks_in_flight(dims: ParallelDims, pp_rank: int) -> int:
    """Chunk-microbatches whose activations pp rank `pp_rank` holds at once (the module docstring's list)."""
    m, pp, v = dims.microbatches, dims.pp, dims.virtual_stages
    if pp == 1 or dims.schedule == "gpipe":
        return m
    if dims.schedule == "1f1b":
        return min(m, pp - pp_rank)
    per_round = m // max(1, m // pp)
    warmup = min((v - 1) * per_round + 2 * (pp - 1 - pp_rank), v * m)
    return min(warmup + 1, v * m)


def device_memory(
    m: ModelConfig,
    dims: ParallelDims,
    *,
    counts: ModelCounts,
    microbatch_size: int,
    precision: str,
    activations: str,
    offload_to_disk: bool = False,
    device: str = "cuda",
) -> MemoryEstimate:
    """The memory of the worst pipeline rank of a training step with sequences of m.seq_len tokens.

    microbatch_size is sequences per microbatch (train.global_batch / (dp * microbatches)); offload_to_disk
    is whether train.offload_dir is set; device is cluster.runtime.device (it decides where host offload lands).
    dims is a checked layout (ParallelDims.from_config holds it against the model's shape), counts m's counts on it
    (plan.setup.model_counts).
    """
    if microbatch_size < 1:
        raise ConfigError(
            f"cannot estimate memory: microbatch_size({microbatch_size}) must be >= 1: train.global_batch / (dp * "
            "microbatches) sequences"
        )
    compute = PRECISIONS[precision].bytes
    tp, pp = dims.tp, dims.pp
    tokens = microbatch_size * m.seq_len // dims.cp  # a cp rank holds T / cp of each sequence
    # Context parallel's additive mask, (T / cp) x T in the compute dtype, one per rank (parallel.context).
    mask = (m.seq_len // dims.cp) * m.seq_len * compute if dims.cp > 1 else 0
    layers = m.n_layers // pp
    chunk_layers = m.n_layers // dims.n_stages
    kept, live = block_kept_and_live(
        m, tp=tp, compute=compute, activations=activations, host=not offload_to_disk, device=device, cp=dims.cp
    )

    def on_rank(rank: int) -> MemoryEstimate:
        first, last = rank == 0, rank == pp - 1
        params = counts.stage_params[rank]
        heads_held = (dims.microbatches if dims.schedule == "gpipe" else 1) * last
        stored = chunks_in_flight(dims, rank) * (chunk_layers * kept + first * INDEX)
        stored += heads_held * head_saved(m, compute=compute)
        # The microbatch in backward has released its head's tensors by the time it reaches a block.
        peak = max(last * head_transient(m), live - last * head_saved(m, compute=compute))
        shard = dims.shard_ranks
        held = -(-params // shard)  # FSDP pads every shard to the same size
        copies = (layers * counts.linear_params + last * counts.output_params) * BF16 if precision == "bf16" else 0
        gathered = fsdp_gathered(counts, dims, rank, compute=compute) if shard > 1 else 0
        copies = 0 if shard > 1 else copies  # FSDP's mixed precision gathers bf16 in place of autocast's copies
        return MemoryEstimate(
            parameters=held * FP32,
            gradients=held * FP32,
            optimizer_state=2 * held * FP32,
            weight_copies=copies,
            activations=tokens * (stored + peak) + mask,
            gathered=gathered,
            pp_rank=rank,
        )

    return max((on_rank(rank) for rank in range(pp)), key=lambda e: e.total)


def plan_memory(cfg: TrainflowConfig, setup: PlanSetup) -> MemoryEstimate:
    """The memory estimate of a composed config's training step."""
    return device_memory(
        cfg.model,
        setup.layout,
        counts=setup.counts,
        microbatch_size=setup.microbatch_size,
        precision=setup.precision,
        activations=setup.activations,
        offload_to_disk=bool(cfg.train.offload_dir),
        device=cfg.cluster.runtime.device,
    )
