"""A checkpoint that fails its checks ends its error with what the reader does next: training falls back to the
previous one, the export does not (it said it did), and tells the user to give it an earlier step."""

from __future__ import annotations

import os

import pytest

from trainflow.checkpoint.manifest import MANIFEST, ChecksumError, verify, write_manifest
from trainflow.config import compose
from trainflow.export.source import NO_FALLBACK, checked_shapes, choose_model


def dcp_folder(folder) -> None:
    """A checkpoint folder as DCP writes one for two ranks (random bytes for contents), with its manifest."""
    for name in ("__0_0.distcp", "__1_0.distcp", ".metadata"):
        (folder / name).write_bytes(os.urandom(5000))
    write_manifest(folder, step=3)


DAMAGE = {
    "a corrupt shard": lambda folder: (folder / "__1_0.distcp").write_bytes(b"x" * 5000),
    "a shard too many": lambda folder: (folder / "__9_0.distcp").write_bytes(b"x"),
    "a manifest that is no JSON": lambda folder: (folder / MANIFEST).write_text("{"),
}


@pytest.mark.parametrize("damage", DAMAGE, ids=list(DAMAGE))
def test_the_export_does_not_claim_to_fall_back(tmp_path, damage):
    dcp_folder(tmp_path)
    DAMAGE[damage](tmp_path)
    with pytest.raises(ChecksumError) as err:
        verify(tmp_path)
    assert str(err.value).endswith("(trainflow falls back to the previous one)"), str(err.value)
    model = compose("train_segment").model
    steps = [lambda: checked_shapes(tmp_path, model, fix="")]  # the export's verification
    if damage == "a manifest that is no JSON":
        steps.append(lambda: choose_model(tmp_path, model))  # which reads the manifest first
    for export_step in steps:
        with pytest.raises(ChecksumError) as err:
            export_step()
        message = str(err.value)
        assert "falls back" not in message and message.endswith(f"({NO_FALLBACK})") and "\n" not in message, message
