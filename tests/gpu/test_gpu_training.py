"""Training on a CUDA GPU: the tiny Llama learns in bf16 with compiled blocks. Skipped without a GPU.

    .venv/bin/python -m pytest tests/gpu -q -rs

The step is the Trainer's on one process, less its data pipeline: forward under torch.autocast(bf16)
with fp32 weights, cross_entropy, backward, clip_grad_norm_, `build_optimizer`'s AdamW (fused on CUDA),
with every block compiled by `apply_compile`. The data is the fixed test corpus (tests/assets/corpus)
as byte tokens, random windows of it per step; 20 steps at the adamw preset's lr take the loss from
ln(257) = 5.55 to well below it (bytes of Python source are far from uniform).
"""

from __future__ import annotations

import pytest
import torch

from tests.conftest import REPO
from trainflow.config import BYTE_VOCAB, compose
from trainflow.model import Llama, cross_entropy
from trainflow.train.compile import apply_compile
from trainflow.train.controls import build_optimizer

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU (torch.cuda.is_available() is False)"),
]

STEPS = 20
BATCH = 8


def corpus_tokens(device: torch.device) -> torch.Tensor:
    """The fixed test corpus as byte tokens (ids 0-255 of the 257-token byte vocabulary)."""
    data = b"".join(p.read_bytes() for p in sorted((REPO / "tests/assets/corpus").glob("*.txt")))
    return torch.frombuffer(bytearray(data), dtype=torch.uint8).to(device=device, dtype=torch.long)


def train_losses(device: torch.device, steps: int = STEPS) -> list[float]:
    """The tiny preset's losses over `steps` compiled bf16 training steps on `device`."""
    cfg = compose("train_segment", ["model=tiny", f"model.vocab_size={BYTE_VOCAB}"])
    m = cfg.model
    torch.manual_seed(0)
    model = Llama(m).to(device)
    apply_compile([model], device)
    opt = build_optimizer(model, cfg.optim, device)
    tokens = corpus_tokens(device)
    offsets = torch.arange(m.seq_len + 1, device=device)
    losses = []
    for _ in range(steps):
        starts = torch.randint(0, len(tokens) - m.seq_len - 1, (BATCH, 1), device=device)
        window = tokens[starts + offsets]  # (B, T + 1)
        with torch.autocast(device.type, dtype=torch.bfloat16):
            loss = cross_entropy(model(window[:, :-1]), window[:, 1:])
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), cfg.optim.grad_clip)
        opt.step()
        opt.zero_grad(set_to_none=True)
        losses.append(loss.item())
    return losses


def test_tiny_llama_learns_on_gpu_in_bf16_compiled():
    losses = train_losses(torch.device("cuda"))
    assert all(torch.isfinite(torch.tensor(losses))), f"non-finite loss: {losses}"
    first, last = sum(losses[:3]) / 3, sum(losses[-3:]) / 3
    assert last < first - 1.0, f"the loss did not fall by 1 nat in {STEPS} steps: {[round(x, 3) for x in losses]}"
