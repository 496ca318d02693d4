"""trainflow.config.shape against the model it describes: a Llama of every preset built on the meta device (no
memory), and the tensor-parallel plan built from the same table."""

from __future__ import annotations

import pytest
import torch
from torch import nn
from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel

from trainflow.config import CONF_DIR, compose
from trainflow.config.shape import (
    SPLITS,
    block_params,
    embedding_params,
    flops_per_token,
    head_params,
    linear_params,
    linear_shapes,
    stage_params,
    total_params,
)
from trainflow.model import Llama
from trainflow.parallel.pipeline import split_model
from trainflow.parallel.tensor_parallel import TP_PLAN

PRESETS = sorted(p.stem for p in (CONF_DIR / "model").glob("*.yaml"))


@pytest.fixture(scope="module", params=PRESETS)
def model(request):
    m = compose("train_segment", [f"model={request.param}"]).model
    with torch.device("meta"):
        return m, Llama(m)


def test_linear_shapes_are_the_blocks(model):
    m, llama = model
    for block in llama.layers.values():
        real = {n: (mod.in_features, mod.out_features) for n, mod in block.named_modules() if type(mod) is nn.Linear}
        assert real == linear_shapes(m)


def test_tensor_parallel_splits_what_the_plan_shards(model):
    """ColwiseParallel shards a Linear's out features (its weight's dim 0), RowwiseParallel its in features."""
    m, _ = model
    assert set(TP_PLAN) == set(SPLITS)
    for name, split in SPLITS.items():
        assert type(TP_PLAN[name]) is {"colwise": ColwiseParallel, "rowwise": RowwiseParallel}[split]
    for tp in (t for t in (2, 4, 8) if m.n_kv_heads % t == 0):
        for name, (d_in, d_out) in linear_shapes(m, tp=tp).items():
            whole_in, whole_out = linear_shapes(m)[name]
            split = (whole_in, whole_out // tp) if SPLITS[name] == "colwise" else (whole_in // tp, whole_out)
            assert (d_in, d_out) == split
        assert linear_params(m, tp=tp) * tp == linear_params(m)


def test_parameter_counts_are_the_models(model):
    m, llama = model
    assert total_params(m) == llama.num_params()
    assert block_params(m) == sum(p.numel() for p in llama.layers["0"].parameters())
    assert embedding_params(m) == llama.tok_embeddings.weight.numel()
    assert head_params(m) == llama.norm.weight.numel() + (not m.tie_embeddings) * llama.output.weight.numel()
    assert (llama.output.weight is llama.tok_embeddings.weight) == m.tie_embeddings


@pytest.mark.parametrize("pp", [2, 4])
def test_pipeline_ranks_hold_their_stage(model, pp):
    m, llama = model
    stages = [split_model(llama, s, pp).num_params() for s in range(pp)]
    assert stages == [stage_params(m, pp_rank=r, pp=pp) for r in range(pp)]
    # A tied head: the last stage holds a copy of the first's embedding (parallel.pipeline sums their gradients).
    assert sum(stages) == total_params(m) + m.tie_embeddings * embedding_params(m)


def test_flops_per_token_count_every_matmul_weight(model):
    """6 FLOPs per matmul weight and token (forward and backward), plus attention's 12 * layers * dim * seq_len."""
    m, llama = model
    matmul = sum(mod.weight.numel() for mod in llama.modules() if type(mod) is nn.Linear)
    assert flops_per_token(m) == 6 * matmul + 12 * m.n_layers * m.dim * m.seq_len
