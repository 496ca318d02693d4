"""Tensor parallel: Megatron's column/row split of every block's attention and MLP, and the vocabulary split of the
embedding and output head, as DTensor styles.

apply_tp(model_chunk, mesh["tp"])
"""

from __future__ import annotations

from torch import nn
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.tensor import DTensor, Replicate
from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module

from trainflow.config.shape import SPLITS

# Megatron's layout (trainflow.config.shape.SPLITS): the linears into attention heads / the SwiGLU width
# column-parallel, the ones out row-parallel, so a block needs one all-reduce in attention and one in the MLP,
# forward and backward. wk / wv shard whole key/value heads (config.layout checks tp divides n_kv_heads), so each
# rank's query heads find their shared key/value head locally. A Float8Linear (train.fp8) is an nn.Linear, so the
# same styles shard it; it runs its fp8 GEMMs on the shards with scales agreed over tp (trainflow.fp8.linear).
STYLES = {"colwise": ColwiseParallel, "rowwise": RowwiseParallel}
TP_PLAN = {name: STYLES[split]() for name, split in SPLITS.items()}

# The ends, split by vocabulary row as torchtitan splits them: the embedding row-parallel (each rank looks up its
# rows, the others' tokens give zeros, one all-reduce makes the whole (B, T, C)), the head column-parallel over the
# same rows, its logits all-gathered to (B, T, vocab). A vocabulary tp does not divide splits unevenly, the larger
# shares first as torch.chunk cuts them (the byte tokenizer's 257 rows: 129 + 128 at tp2; config.shape.vocab_rows).
# Without sequence parallelism both ends take and give whole tensors; the loss stays the one cross_entropy of every
# layout (torch's loss_parallel would spare the logits' all-gather, but the pipeline schedules call the loss on a
# plain tensor). A tied head's weight is the embedding's: both split it Shard(0), so they share the one DTensor.
END_PLAN = {
    "tok_embeddings": RowwiseParallel(input_layouts=Replicate(), output_layouts=Replicate()),
    "output": ColwiseParallel(input_layouts=Replicate(), output_layouts=Replicate()),
}


def apply_tp(model: nn.Module, tp_mesh: DeviceMesh) -> None:
    """Shard every block's attention and MLP, and the embedding and head this chunk holds, over the tp mesh; the
    norms stay replicated."""
    for block in model.layers.values():
        parallelize_module(block, tp_mesh, TP_PLAN)
    ends = {name: style for name, style in END_PLAN.items() if getattr(model, name) is not None}
    tied = len(ends) == 2 and model.output.weight is model.tok_embeddings.weight
    parallelize_module(model, tp_mesh, ends)
    if tied:  # each style wrapped the weight in a Parameter of its own: the head takes the embedding's back
        model.output.weight = model.tok_embeddings.weight
    if model.tok_embeddings is not None:
        keep_own_rows(model.tok_embeddings.weight)


def keep_own_rows(weight: DTensor) -> None:
    """Make the embedding's gradient lie as its weight does. torch 2.13's DTensor has no row-wise embedding backward:
    it replicates the ids and the output's gradient and makes the whole (vocab, C) gradient on every tp rank, which
    the pipeline's tied sum and the dp buckets would take for this rank's rows. The hook keeps those rows (a slice, no
    communication); the whole gradient lives only while the embedding's backward runs. FSDP2, which replaces the
    Parameter, does the same redistribution itself."""
    weight.register_hook(lambda grad: grad.redistribute(weight.device_mesh, weight.placements))
