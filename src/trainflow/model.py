"""A GPT-style decoder: plain single-device PyTorch, no torch.distributed anywhere in it.

    python -c "from trainflow.config import compose; from trainflow.model import GPT; \
        print(GPT(compose('train_segment').model).num_params())"

Parallelism is applied afterwards (trainflow.parallel): tensor parallel shards the Linear layers
named in its plan, so attention infers its local head count from the projection width (`-1` in
the view below); pipeline parallel deletes layers and sets `tok_embeddings` / `norm` / `output`
to None on the stages that do not own them, which `forward` allows for.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

from trainflow.config import ModelConfig


class Attention(nn.Module):
    def __init__(self, dim: int, n_heads: int) -> None:
        super().__init__()
        self.head_dim = dim // n_heads
        # Separate q/k/v (not one fused qkv) so column-parallel sharding splits whole heads.
        self.wq = nn.Linear(dim, dim, bias=False)
        self.wk = nn.Linear(dim, dim, bias=False)
        self.wv = nn.Linear(dim, dim, bias=False)
        self.wo = nn.Linear(dim, dim, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        B, T, _ = x.shape
        q, k, v = (
            w(x).view(B, T, -1, self.head_dim).transpose(1, 2) for w in (self.wq, self.wk, self.wv)
        )  # (B, nh, T, hs)
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)  # (B, nh, T, hs)
        return self.wo(y.transpose(1, 2).reshape(B, T, -1))


class FeedForward(nn.Module):
    def __init__(self, dim: int, hidden: int) -> None:
        super().__init__()
        self.w1 = nn.Linear(dim, hidden, bias=False)  # up: column-parallel under TP
        self.w2 = nn.Linear(hidden, dim, bias=False)  # down: row-parallel under TP

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.w2(F.gelu(self.w1(x)))


class Block(nn.Module):
    def __init__(self, dim: int, n_heads: int, ffn_dim: int, norm_eps: float) -> None:
        super().__init__()
        self.attention_norm = nn.LayerNorm(dim, eps=norm_eps)
        self.attention = Attention(dim, n_heads)
        self.ffn_norm = nn.LayerNorm(dim, eps=norm_eps)
        self.feed_forward = FeedForward(dim, ffn_dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attention(self.attention_norm(x))
        return x + self.feed_forward(self.ffn_norm(x))


class GPT(nn.Module):
    def __init__(self, m: ModelConfig) -> None:
        super().__init__()
        self.n_layers, self.init_std = m.n_layers, m.init_std
        self.tok_embeddings: nn.Embedding | None = nn.Embedding(m.vocab_size, m.dim)
        self.pos_embeddings: nn.Embedding | None = nn.Embedding(m.seq_len, m.dim)
        # A ModuleDict keyed by the global layer index: pipeline stages keep a subset, names stay stable
        # (so checkpoints of any layout share keys).
        self.layers = nn.ModuleDict({str(i): Block(m.dim, m.n_heads, m.ffn_dim, m.norm_eps) for i in range(m.n_layers)})
        self.norm: nn.LayerNorm | None = nn.LayerNorm(m.dim, eps=m.norm_eps)
        self.output: nn.Linear | None = nn.Linear(m.dim, m.vocab_size, bias=False)
        self.init_weights()

    def init_weights(self) -> None:
        """GPT-2 init: N(0, std), residual projections scaled by 1/sqrt(2 * n_layers)."""
        for name, p in self.named_parameters():
            if p.dim() == 1:
                continue  # LayerNorm weight/bias keep 1 / 0
            std = (
                self.init_std / math.sqrt(2 * self.n_layers)
                if name.endswith(("wo.weight", "w2.weight"))
                else self.init_std
            )
            nn.init.normal_(p, mean=0.0, std=std)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """(B, T) token ids -> (B, T, vocab) logits; on a middle pipeline stage (B, T, C) -> (B, T, C)."""
        if self.tok_embeddings is not None:
            T = x.shape[1]
            x = self.tok_embeddings(x) + self.pos_embeddings(torch.arange(T, device=x.device))  # (B, T, C)
        for layer in self.layers.values():
            x = layer(x)
        if self.norm is not None:
            x = self.norm(x)
        if self.output is not None:
            x = self.output(x)
        return x

    def num_params(self) -> int:
        return sum(p.numel() for p in self.parameters())


def flops_per_token(*, n_params: int, n_layers: int, dim: int, seq_len: int) -> float:
    """Training FLOPs per token: 6N for the matmuls plus 12 * L * d * T for attention (PaLM, appendix B)."""
    return 6 * n_params + 12 * n_layers * dim * seq_len


def cross_entropy(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """Mean next-token loss over every position of the batch."""
    return F.cross_entropy(logits.flatten(0, 1).float(), targets.flatten(0, 1))
