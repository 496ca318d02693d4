"""Tensor parallel: Megatron's column/row split of every block's attention and MLP, as DTensor styles.

apply_tp(model_chunk, mesh["tp"])
"""

from __future__ import annotations

from torch import nn
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module

from trainflow.config.shape import SPLITS

# Megatron's layout (trainflow.config.shape.SPLITS): the linears into attention heads / the SwiGLU width
# column-parallel, the ones out row-parallel, so a block needs one all-reduce in attention and one in the MLP,
# forward and backward. wk / wv shard whole key/value heads (config.layout checks tp divides n_kv_heads), so each
# rank's query heads find their shared key/value head locally. A Float8Linear (train.fp8) is an nn.Linear, so the
# same styles shard it; it runs its fp8 GEMMs on the shards with scales agreed over tp (trainflow.fp8.linear).
STYLES = {"colwise": ColwiseParallel, "rowwise": RowwiseParallel}
TP_PLAN = {name: STYLES[split]() for name, split in SPLITS.items()}


def apply_tp(model: nn.Module, tp_mesh: DeviceMesh) -> None:
    """Shard every block's attention and MLP over the tp mesh; embeddings, norms and head stay replicated."""
    for block in model.layers.values():
        parallelize_module(block, tp_mesh, TP_PLAN)
