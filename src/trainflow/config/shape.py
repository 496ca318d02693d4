"""The model's shape without torch: each block linear and how tensor parallelism splits it, parameters per block,
pipeline rank and model, and training FLOPs per token. The one home of these counts: trainflow.model builds its
linears from `linear_shapes`, trainflow.parallel.tensor_parallel's plan is `SPLITS`, and the planner, the config
checks and the trainer's MFU count with the functions below. tests/unit/test_shape.py holds every function
against a Llama built on the meta device, for every preset (as torchtitan keeps the counts beside its model args).

    python -c "from trainflow.config import compose; from trainflow.config.shape import total_params; \
        print(total_params(compose('train_segment', ['model=llama3_70b']).model))"

Megatron's tensor-parallel layout: the linears into the attention heads and the SwiGLU width are column-parallel
(each tp rank holds out_features / tp of them), the ones out of them row-parallel (in_features / tp), so a block
runs one all-reduce after attention and one after the MLP. The embedding and output head split by vocabulary row
(rank 0 holding the larger share of an uneven split, as DTensor chunks it; a tied head: the one weight, split alike);
the norms are whole on every tp rank. Pipeline rank r of p holds n_layers / p blocks, the embedding
on rank 0, the final norm and output head on rank p - 1 (a tied head: a copy of the embedding there).
"""

from __future__ import annotations

from trainflow.config.schema import ModelConfig

SPLITS = {
    "attention.wq": "colwise",
    "attention.wk": "colwise",
    "attention.wv": "colwise",
    "attention.wo": "rowwise",
    "feed_forward.w1": "colwise",
    "feed_forward.w3": "colwise",
    "feed_forward.w2": "rowwise",
}
"""Each linear of a block (its module path inside the block) and how tensor parallelism splits it."""


def linear_shapes(m: ModelConfig, *, tp: int = 1) -> dict[str, tuple[int, int]]:
    """(in features, out features) of each block linear on one tp rank (the whole linear at tp = 1)."""
    q, kv, f = m.n_heads * m.head_dim, m.n_kv_heads * m.head_dim, m.ffn_dim
    whole = {
        "attention.wq": (m.dim, q),
        "attention.wk": (m.dim, kv),
        "attention.wv": (m.dim, kv),
        "attention.wo": (q, m.dim),  # wk, wv: grouped-query attention's narrower key/value heads
        "feed_forward.w1": (m.dim, f),  # SwiGLU's gate
        "feed_forward.w3": (m.dim, f),  # and its up projection
        "feed_forward.w2": (f, m.dim),
    }
    return {name: (i, o // tp) if SPLITS[name] == "colwise" else (i // tp, o) for name, (i, o) in whole.items()}


def linear_params(m: ModelConfig, *, tp: int = 1) -> int:
    """Weights of one block's linears on one tp rank (no biases)."""
    return sum(i * o for i, o in linear_shapes(m, tp=tp).values())


def block_params(m: ModelConfig, *, tp: int = 1) -> int:
    """One block's parameters on one tp rank: its two RMSNorm weights (whole on every rank) and its linears."""
    return 2 * m.dim + linear_params(m, tp=tp)


def vocab_rows(m: ModelConfig, *, tp: int = 1) -> int:
    """The vocabulary rows of the embedding and head on tp rank 0 (the largest share: DTensor's Shard(0) chunks)."""
    return -(-m.vocab_size // tp)


def embedding_params(m: ModelConfig, *, tp: int = 1) -> int:
    return vocab_rows(m, tp=tp) * m.dim


def output_params(m: ModelConfig, *, tp: int = 1) -> int:
    """The output head's weight on one tp rank: the model's one matmul outside the blocks (tied or not, it
    multiplies)."""
    return vocab_rows(m, tp=tp) * m.dim


def head_params(m: ModelConfig, *, pp: int = 1, tp: int = 1) -> int:
    """The final RMSNorm and the output head; a head tied to the embedding is the embedding's own weight on one
    stage (not counted again), a copy of it on the last of several pipeline stages."""
    return m.dim + (not m.tie_embeddings or pp > 1) * output_params(m, tp=tp)


def stage_params(m: ModelConfig, *, pp_rank: int = 0, pp: int = 1, tp: int = 1) -> int:
    """Parameters pipeline rank `pp_rank` of `pp` holds on one tp rank (virtual stages do not change the sum)."""
    return (
        m.n_layers // pp * block_params(m, tp=tp)
        + (pp_rank == 0) * embedding_params(m, tp=tp)
        + (pp_rank == pp - 1) * head_params(m, pp=pp, tp=tp)
    )


def total_params(m: ModelConfig) -> int:
    return stage_params(m)


def block_flops_per_token(m: ModelConfig, *, tp: int = 1) -> tuple[float, float]:
    """Forward FLOPs per token of one block on one tp rank: its linears (2 per weight) and attention's QK^T and
    AV over the full T x T (2 * 2 * T * query width / tp, as PaLM's appendix B counts it). Backward is twice these."""
    return 2.0 * linear_params(m, tp=tp), 4.0 * m.seq_len * (m.n_heads * m.head_dim // tp)


def flops_per_token(m: ModelConfig) -> float:
    """Training FLOPs per token of the whole model: forward and backward (x3) of every block and of the output head
    (the embedding is a lookup, not a matmul); what MFU divides by."""
    linear, attention = block_flops_per_token(m)
    return 3 * (m.n_layers * (linear + attention) + 2.0 * output_params(m))


def mfu(m: ModelConfig, tokens_per_s_per_device: float, *, peak_tflops: float) -> float:
    """Model FLOPs utilisation: the model's training FLOPs per second per device over the device's dense peak
    (cluster.hardware.peak_tflops); recomputation's extra forward is not counted, as torchtitan counts it."""
    return tokens_per_s_per_device * flops_per_token(m) / (peak_tflops * 1e12)
