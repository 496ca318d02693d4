"""Swap a Llama's block linears for Float8Linear in place (the sizes they need are checked with the config:
trainflow.config.rules.fp8_errors).

    backend = apply_fp8(part, recipe="delayed", history_len=16)           # per model chunk

Only the linears inside the blocks (`.layers`: attention wq/wk/wv/wo, feed-forward w1/w2/w3) change; the
embedding and the output head stay in bf16/fp32, as torchao and Transformer Engine recipes leave them (the
head's logits are the most sensitive GEMM, and it is a small share of a large model's FLOPs). The swap keeps the
Parameter objects, so the state_dict's parameter keys and values, the optimizer and checkpoints of a run without
fp8 are unchanged; the delayed recipe adds one buffer per linear, `<name>.amax_history`. Apply it to each
pipeline chunk before tensor/data parallel wrap the chunk (FSDP2 and DDP hold the modules they were given).
"""

from __future__ import annotations

from torch import nn

from trainflow.fp8.kernels import load_backend
from trainflow.fp8.linear import Float8Linear


def block_linears(block: nn.Module) -> list[tuple[nn.Module, str, nn.Linear]]:
    """(parent, attribute, linear) of every plain nn.Linear inside `block`."""
    return [
        (parent, attr, child)
        for parent in block.modules()
        for attr, child in parent.named_children()
        if type(child) is nn.Linear
    ]


def apply_fp8(part: nn.Module, *, recipe: str, history_len: int, margin: int = 0, kernel_cache: str = "") -> str:
    """Swap every nn.Linear in part.layers' blocks for a Float8Linear with the same parameters (recipe and
    history_len as train.fp8 and train.fp8_amax_history, whose domains the schema checks); returns which fp8_gemm
    implementation will run on the chunk's device (trainflow.fp8.kernels.load_backend, which loads a kernel from
    the build cache `kernel_cache`, io.kernel_cache, and never compiles)."""
    for block in part.layers.values():
        for parent, attr, linear in block_linears(block):
            setattr(
                parent, attr, Float8Linear.from_linear(linear, recipe=recipe, history_len=history_len, margin=margin)
            )
    return load_backend(next(part.parameters()).device, kernel_cache)
