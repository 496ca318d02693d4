"""Activation memory modes change where a block's saved tensors live, never the gradients they give."""

from __future__ import annotations

import pytest
import torch

from trainflow.config import compose
from trainflow.model import Llama, cross_entropy
from trainflow.train.activations import OffloadError, apply_activations


def gradients(mode: str, folder=None, *, between=lambda: None) -> list[torch.Tensor]:
    """Every parameter's gradient after one forward/backward of the tiny model in `mode`."""
    torch.manual_seed(0)
    model = Llama(compose("train_segment").model)
    offloader = apply_activations([model], mode, folder)
    x = torch.randint(0, 257, (2, 65))
    loss = cross_entropy(model(x[:, :-1]), x[:, 1:])
    between()
    loss.backward()
    if offloader is not None:
        offloader.close()
    return [p.grad for p in model.parameters()]


@pytest.mark.parametrize("mode", ["recompute", "offload", "offload to a folder"])
def test_modes_give_bitwise_the_gradients_of_keep(mode, tmp_path):
    folder = tmp_path / "acts" if mode == "offload to a folder" else None
    seen = []
    got = gradients(mode.split()[0], folder, between=lambda: seen.extend(folder.iterdir() if folder else []))
    for a, b in zip(got, gradients("keep")):
        assert torch.equal(a, b)
    if folder:
        assert len(seen) >= 4 * 8  # every block's large saved tensors went to files ...
        assert not folder.exists()  # ... which backward read back and close removed


def test_a_changed_offload_file_fails_in_one_line(tmp_path):
    folder = tmp_path / "acts"

    def truncate_one():
        with open(min(folder.iterdir()), "r+b") as f:
            f.truncate(8)

    with pytest.raises(OffloadError, match=r"holds 8 bytes, not the \d+ written: the offload folder changed"):
        gradients("offload", folder, between=truncate_one)
