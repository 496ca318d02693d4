"""The Llama presets have the published shapes; the decoder's pieces behave as Llama's do."""

from __future__ import annotations

import pytest
import torch

from trainflow.config import compose
from trainflow.config.shape import flops_per_token, total_params
from trainflow.errors import ConfigError
from trainflow.model import Llama, rope_tables, rotate

PUBLISHED = {
    "llama3_8b": 8.03e9,
    "llama2_70b": 68.98e9,
    "llama3_70b": 70.55e9,
    "llama3_1_8b": 8.03e9,
    "llama3_1_70b": 70.55e9,
    "llama3_2_1b": 1.24e9,
    "llama3_2_3b": 3.21e9,
}
"""Meta's model cards' counts (a tied head counted once); test_shape holds total_params to a Llama on meta."""
FFN_DIM = {"llama3_8b": 14336, "llama3_1_8b": 14336, "llama3_2_1b": 8192, "llama3_2_3b": 8192}


@pytest.mark.parametrize("preset", sorted(PUBLISHED))
def test_presets_have_the_published_parameter_counts(preset):
    m = compose("train_segment", [f"model={preset}"]).model
    assert round(total_params(m), -7) == PUBLISHED[preset]  # to the published two decimals of a billion
    assert m.ffn_dim == FFN_DIM.get(preset, 28672)


def test_flops_per_token_of_llama3_8b():
    """6 per matmul weight (8.03 B less the 128256 x 4096 embedding and 65 norm vectors) and token, plus
    attention's 12 * layers * dim * seq_len = 12 * 32 * 4096 * 8192, worked out by hand."""
    m = compose("train_segment", ["model=llama3_8b"]).model
    assert flops_per_token(m) == 6 * 7_504_658_432 + 12_884_901_888


def test_grouped_query_attention_shares_key_value_heads():
    m = compose("train_segment").model
    block = Llama(m).layers["0"].attention
    assert (m.n_heads, m.n_kv_heads) == (4, 2)
    assert block.wq.out_features == 2 * block.wk.out_features == 2 * block.wv.out_features == m.dim


def test_rotary_embedding_depends_only_on_relative_position():
    """q . k after rotation by positions (i, j) equals that after (i + s, j + s)."""
    cos, sin = rope_tables(16, 64, 10000.0)
    q, k = torch.randn(16), torch.randn(16)

    def score(i: int, j: int) -> float:
        return float(rotate(q, cos[i], sin[i]) @ rotate(k, cos[j], sin[j]))

    assert score(7, 3) == pytest.approx(score(40, 36), rel=1e-5)
    assert score(7, 3) != pytest.approx(score(7, 5), rel=1e-3)


def test_forward_is_causal():
    torch.manual_seed(0)
    model = Llama(compose("train_segment").model)
    x = torch.randint(0, 257, (1, 16))
    y = x.clone()
    y[0, 10] = (y[0, 10] + 1) % 257
    a, b = model(x), model(y)
    torch.testing.assert_close(a[:, :10], b[:, :10])
    assert not torch.allclose(a[:, 10:], b[:, 10:])


@pytest.mark.parametrize("preset", ["llama3_1_8b", "llama3_2_1b"])
def test_llama3_rope_scaling_is_transformers(preset):
    """model.rope_scaling=llama3 gives transformers' frequencies (its _compute_llama3_parameters) for the preset's
    parameters, and rope_scaling=none the unscaled ones it would otherwise change."""
    from transformers import LlamaConfig
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

    m = compose("train_segment", [f"model={preset}"]).model
    scaling = {"rope_type": "llama3", "factor": m.rope_factor, "low_freq_factor": m.rope_low_freq_factor}
    scaling |= {"high_freq_factor": m.rope_high_freq_factor, "original_max_position_embeddings": 8192}
    hf = LlamaConfig(hidden_size=m.dim, num_attention_heads=m.n_heads, rope_theta=m.rope_theta, rope_scaling=scaling)
    inv_freq, attention_factor = ROPE_INIT_FUNCTIONS["llama3"](hf, "cpu")
    angles = torch.outer(torch.arange(m.seq_len, dtype=torch.float32), inv_freq).repeat(1, 2)
    cos, sin = rope_tables(m.head_dim, m.seq_len, m.rope_theta, m)
    assert attention_factor == 1.0
    torch.testing.assert_close(cos, angles.cos(), rtol=0, atol=0)
    torch.testing.assert_close(sin, angles.sin(), rtol=0, atol=0)
    plain, _ = rope_tables(m.head_dim, m.seq_len, m.rope_theta)
    assert not torch.allclose(plain, cos)


@pytest.mark.parametrize(
    ("overrides", "error"),
    [
        (["model.rope_scaling=yarn"], r"model\.rope_scaling\('yarn'\) must be one of none, llama3"),
        (["model=llama3_1_8b", "model.rope_high_freq_factor=1.0"], r"rope_high_freq_factor\(1\.0\) <= .*4 and 1"),
    ],
)
def test_unsupported_rope_scaling_is_refused(overrides, error):
    with pytest.raises(ConfigError, match=error):
        compose("train_segment", overrides)


def test_a_tied_head_is_the_embedding():
    """One Parameter under both names: a step on the head's gradient moves the embedding (and counts once)."""
    m = compose("train_segment", ["model.tie_embeddings=true"]).model
    model = Llama(m)
    assert model.output.weight is model.tok_embeddings.weight
    untied = Llama(compose("train_segment").model).num_params()
    assert model.num_params() == total_params(m) == untied - m.vocab_size * m.dim
    model(torch.randint(0, m.vocab_size, (1, 8))).sum().backward()
    assert model.tok_embeddings.weight.grad is not None and "output.weight" in model.state_dict()
