"""The Llama presets have the published shapes; the decoder's pieces behave as Llama's do."""

from __future__ import annotations

import pytest
import torch

from trainflow.config import compose
from trainflow.config.shape import flops_per_token, total_params
from trainflow.model import Llama, rope_tables, rotate

PUBLISHED = {"llama3_8b": 8.03e9, "llama2_70b": 68.98e9, "llama3_70b": 70.55e9}


@pytest.mark.parametrize("preset", sorted(PUBLISHED))
def test_presets_have_the_published_parameter_counts(preset):
    m = compose("train_segment", [f"model={preset}"]).model
    assert abs(total_params(m) / PUBLISHED[preset] - 1) < 0.005
    assert m.ffn_dim == {"llama3_8b": 14336}.get(preset, 28672)


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
