"""trainflow.config.shape against the model it describes: a Llama of every preset built on the meta device (no
memory), and the tensor-parallel plan built from the same table, against the shards apply_tp leaves on each rank."""

from __future__ import annotations

import pytest
import torch
from torch import nn
from torch.distributed.tensor import DTensor
from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel

from trainflow.config import CONF_DIR, compose
from trainflow.config.schema import ModelConfig
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
    vocab_rows,
)
from trainflow.model import Llama, cross_entropy
from trainflow.parallel.pipeline import split_model
from trainflow.parallel.tensor_parallel import TP_PLAN, apply_tp

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


def tp2_llama(*, rank: int, tied: bool, backward: bool = False) -> tuple[ModelConfig, Llama]:
    """The tiny Llama with apply_tp's shards on `rank` of a fake 2-rank group (no peer: its collectives return
    uninitialised buffers of the right shapes), after one forward and backward if `backward`."""
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh
    from torch.testing._internal.distributed.fake_pg import FakeStore

    m = compose("train_segment", ["model=tiny", f"model.tie_embeddings={tied}"]).model
    dist.init_process_group("fake", store=FakeStore(), rank=rank, world_size=2)
    try:
        llama = Llama(m)
        apply_tp(llama, init_device_mesh("cpu", (2,)))
        if backward:
            x = torch.randint(0, m.vocab_size, (1, m.seq_len))
            cross_entropy(llama(x), x).backward()
    finally:
        dist.destroy_process_group()
    return m, llama


@pytest.mark.parametrize("tied", [False, True])
@pytest.mark.parametrize("rank", [0, 1])
def test_a_tp_rank_holds_its_vocabulary_rows_even_where_tp_does_not_divide_them(rank, tied):
    """The byte tokenizer's 257 rows split 129 + 128 at tp2 (torch.chunk's cut, the larger share first), embedding
    and head alike; a tied head is the embedding's one DTensor. vocab_rows and stage_params count rank 0's."""
    m, llama = tp2_llama(rank=rank, tied=tied)
    embedding, head = llama.tok_embeddings.weight, llama.output.weight
    assert m.vocab_size == 257 and isinstance(embedding, DTensor) and (head is embedding) == tied
    assert embedding.to_local().shape == head.to_local().shape == (129 - rank, m.dim)
    assert vocab_rows(m, tp=2) == 129 and embedding_params(m, tp=2) == 129 * m.dim
    local = sum(p.to_local().numel() if isinstance(p, DTensor) else p.numel() for p in llama.parameters())
    assert local == stage_params(m, tp=2) - rank * (2 - tied) * m.dim


@pytest.mark.parametrize("tied", [False, True])
def test_the_ends_gradients_lie_as_their_weights(tied):
    """DTensor makes the embedding's whole gradient on every rank; apply_tp keeps the rank's own rows, so the
    pipeline's tied sum and the dp buckets get shards (rank 0: the fake group cannot gather rank 1's smaller share
    of the logits; the launcher's tp2 runs hold both ranks)."""
    m, llama = tp2_llama(rank=0, tied=tied, backward=True)
    for w in (llama.tok_embeddings.weight, llama.output.weight):
        assert w.grad.placements == w.placements and w.grad.to_local().shape == (129, m.dim)
