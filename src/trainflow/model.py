"""A Llama-style decoder: plain single-device PyTorch, no torch.distributed anywhere in it.

    python -c "from trainflow.config import compose; from trainflow.model import Llama; \
        print(Llama(compose('train_segment').model).num_params())"

Its shape (each linear's features, parameter and FLOP counts) is trainflow.config.shape's, which counts without
torch; tests/unit/test_shape.py holds the two against each other.

RMSNorm before attention and MLP, rotary position embeddings, grouped-query attention (n_kv_heads
key/value heads, each shared by n_heads / n_kv_heads query heads), a SwiGLU MLP and an output head, untied
or tied to the embedding (model.tie_embeddings, Llama 3.2 1B / 3B): the architecture of Llama 2 and 3, with
Hugging Face's LlamaForCausalLM parameter layout up to names (trainflow.export maps them). Rotary embeddings
rotate the two halves of each head (HF's `rotate_half`), not interleaved pairs (Meta's complex form), so an
exported q/k projection needs no permutation; model.rope_scaling=llama3 rescales their frequencies as Llama 3.1 does.

Parallelism is applied afterwards (trainflow.parallel): tensor parallel shards the Linear layers
named in its plan, so attention infers its local head count from the projection width (`-1` in
the views below); pipeline parallel deletes layers and sets `tok_embeddings` / `norm` / `output`
to None on the stages that do not own them, which `forward` allows for. How a block keeps what
backward needs (trainflow.train.activations) goes through `run_block`. Context parallel replaces each attention's
`core` and gives the rotary tables the rows of the positions the rank holds (`forward` takes the first T rows).
"""

from __future__ import annotations

import math
from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import nn

from trainflow.config import ModelConfig
from trainflow.config.shape import linear_shapes


def rope_tables(
    head_dim: int, seq_len: int, theta: float, scaling: ModelConfig | None = None
) -> tuple[torch.Tensor, torch.Tensor]:
    """cos and sin of every position's rotation angles, (seq_len, head_dim), halves repeated; the frequencies
    rescaled as `scaling`'s rope_scaling says (None or none: as the base theta gives them)."""
    inv_freq = 1.0 / theta ** (torch.arange(0, head_dim, 2, dtype=torch.float32) / head_dim)
    if scaling is not None and scaling.rope_scaling == "llama3":
        inv_freq = llama3_frequencies(inv_freq, scaling)
    angles = torch.outer(torch.arange(seq_len, dtype=torch.float32), inv_freq)
    angles = torch.cat((angles, angles), dim=-1)
    return angles.cos(), angles.sin()


def llama3_frequencies(inv_freq: torch.Tensor, m: ModelConfig) -> torch.Tensor:
    """Llama 3.1's scaling, step for step as transformers' _compute_llama3_parameters: wavelengths longer than
    original / low_freq_factor slow down by rope_factor, shorter than original / high_freq_factor stay, and those
    between blend the two by where original / wavelength lies between the factors."""
    factor, low, high, original = (
        m.rope_factor,
        m.rope_low_freq_factor,
        m.rope_high_freq_factor,
        m.rope_original_seq_len,
    )
    wavelen = 2 * math.pi / inv_freq
    scaled = torch.where(wavelen > original / low, inv_freq / factor, inv_freq)
    smooth = (original / wavelen - low) / (high - low)
    smoothed = (1 - smooth) * scaled / factor + smooth * scaled
    medium = ~(wavelen < original / high) & ~(wavelen > original / low)
    return torch.where(medium, smoothed, scaled)


def rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotary embedding of (B, heads, T, head_dim): each pair (i, i + head_dim/2) turned by its angle."""
    # In fp32 whatever x's dtype (as torchtitan does): bf16 angles would blur positions; q and k return in x's dtype.
    first, second = x.float().chunk(2, dim=-1)
    return (x.float() * cos + torch.cat((-second, first), dim=-1) * sin).to(x.dtype)


def linears(m: ModelConfig, prefix: str) -> dict[str, nn.Linear]:
    """The block's linears under `prefix` (attention, feed_forward), shaped as trainflow.config.shape says."""
    return {
        name.removeprefix(f"{prefix}."): nn.Linear(d_in, d_out, bias=False)
        for name, (d_in, d_out) in linear_shapes(m).items()
        if name.startswith(f"{prefix}.")
    }


def attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor | None = None) -> torch.Tensor:
    """Grouped-query attention of q (B, heads, Tq, hd) over k and v (B, kv_heads, Tk, hd): under the causal mask
    (Tq = Tk), or under `mask` (Tq, Tk), True where a query may attend a key."""
    if mask is not None:  # SDPA's own grouping: repeated, the keys of a long sequence would be saved n_rep times
        return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, enable_gqa=True)  # (B, heads, Tq, hd)
    # Each key/value head serves heads / kv_heads consecutive query heads (as HF's repeat_kv).
    n_rep = q.shape[1] // k.shape[1]
    k, v = k.repeat_interleave(n_rep, dim=1), v.repeat_interleave(n_rep, dim=1)
    return F.scaled_dot_product_attention(q, k, v, is_causal=True)  # (B, heads, T, hd)


class Attention(nn.Module):
    def __init__(self, m: ModelConfig) -> None:
        super().__init__()
        self.head_dim = m.head_dim
        # Separate q/k/v (not one fused qkv) so column-parallel sharding splits whole heads.
        layers = linears(m, "attention")
        self.wq, self.wk, self.wv, self.wo = (layers[n] for n in ("wq", "wk", "wv", "wo"))
        self.core: Callable[[torch.Tensor, torch.Tensor, torch.Tensor], torch.Tensor] = attention
        """q, k, v -> the heads' outputs; trainflow.parallel.context swaps it to gather K and V over the cp ranks."""

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        B, T, _ = x.shape
        q, k, v = (w(x).view(B, T, -1, self.head_dim).transpose(1, 2) for w in (self.wq, self.wk, self.wv))
        q, k = rotate(q, cos, sin), rotate(k, cos, sin)  # (B, heads, T, hd), k and v (B, kv_heads, T, hd)
        y = self.core(q, k, v)  # (B, heads, T, hd)
        return self.wo(y.transpose(1, 2).reshape(B, T, -1))


class FeedForward(nn.Module):
    """SwiGLU: w2(silu(w1 x) * w3 x); w1 is the gate, w3 the up and w2 the down projection."""

    def __init__(self, m: ModelConfig) -> None:
        super().__init__()
        layers = linears(m, "feed_forward")
        self.w1, self.w3, self.w2 = (layers[n] for n in ("w1", "w3", "w2"))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.w2(F.silu(self.w1(x)) * self.w3(x))


class Block(nn.Module):
    def __init__(self, m: ModelConfig) -> None:
        super().__init__()
        self.attention_norm = nn.RMSNorm(m.dim, eps=m.norm_eps)
        self.attention = Attention(m)
        self.ffn_norm = nn.RMSNorm(m.dim, eps=m.norm_eps)
        self.feed_forward = FeedForward(m)

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        x = x + self.attention(self.attention_norm(x), cos, sin)
        return x + self.feed_forward(self.ffn_norm(x))


def call_block(block: nn.Module, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    return block(x, cos, sin)


class Llama(nn.Module):
    def __init__(self, m: ModelConfig) -> None:
        super().__init__()
        self.n_layers, self.init_std, self.tie_embeddings = m.n_layers, m.init_std, m.tie_embeddings
        self.tok_embeddings: nn.Embedding | None = nn.Embedding(m.vocab_size, m.dim)
        # A ModuleDict keyed by the global layer index: pipeline stages keep a subset, names stay stable
        # (so checkpoints of any layout share keys).
        self.layers = nn.ModuleDict({str(i): Block(m) for i in range(m.n_layers)})
        self.norm: nn.RMSNorm | None = nn.RMSNorm(m.dim, eps=m.norm_eps)
        self.output: nn.Linear | None = nn.Linear(m.dim, m.vocab_size, bias=False)
        if m.tie_embeddings:  # one Parameter under two names; pipeline stages hold copies (parallel.pipeline)
            self.output.weight = self.tok_embeddings.weight
        # Derived from the config, so not saved: checkpoint keys are the parameters only.
        cos, sin = rope_tables(m.head_dim, m.seq_len, m.rope_theta, m)
        self.register_buffer("rope_cos", cos, persistent=False)
        self.register_buffer("rope_sin", sin, persistent=False)
        self.run_block: Callable[..., torch.Tensor] = call_block
        """Runs one block; trainflow.train.activations swaps it to recompute or offload."""
        self.init_weights()

    def init_weights(self) -> None:
        """N(0, init_std), residual projections (wo, w2) scaled by 1/sqrt(2 * n_layers) as in GPT-2; norms 1."""
        for name, p in self.named_parameters():
            if p.dim() == 1:
                continue  # RMSNorm weights keep 1
            std = self.init_std / math.sqrt(2 * self.n_layers) if name.endswith(("wo.weight", "w2.weight")) else None
            nn.init.normal_(p, mean=0.0, std=std or self.init_std)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """(B, T) token ids -> (B, T, vocab) logits; on a middle pipeline stage (B, T, C) -> (B, T, C)."""
        if self.tok_embeddings is not None:
            x = self.tok_embeddings(x)  # (B, T, C)
        T = x.shape[1]
        cos, sin = self.rope_cos[:T], self.rope_sin[:T]
        for layer in self.layers.values():
            x = self.run_block(layer, x, cos, sin)
        if self.norm is not None:
            x = self.norm(x)
        if self.output is not None:
            x = self.output(x)
        return x

    def num_params(self) -> int:
        return sum(p.numel() for p in self.parameters())


def cross_entropy(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """Mean next-token loss over every position of the batch."""
    return F.cross_entropy(logits.flatten(0, 1).float(), targets.flatten(0, 1))
