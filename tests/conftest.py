"""Shared fixtures: a small real token file (the standard library's sources) and config composition."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from trainflow.config import TrainflowConfig, compose
from trainflow.data.tokens import ByteTokenizer  # noqa: F401  (imported early: h5py before torch.distributed)
from trainflow.stages import prepare_data

REPO = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="session")
def tokens(tmp_path_factory) -> Path:
    """~400 kB of real Python source, byte-tokenised, with a validation split."""
    out = tmp_path_factory.mktemp("data") / "tokens.h5"
    cfg = compose("prepare_data", ["experiment=smoke", f"io.tokens={out}"])
    prepare_data.run(cfg)
    return out


def make_config(stage: str, root: Path, *overrides: str, tokens: Path | None = None) -> TrainflowConfig:
    """A smoke-sized config whose every path lies under `root`."""
    extra = [f"io.staged_tokens={tokens}", f"io.tokens={tokens}"] if tokens else []
    return compose(stage, ["experiment=smoke", f"storage.root={root}", *extra, *overrides])


def read_json(path: str | Path) -> dict:
    return json.loads(Path(path).read_text())


@pytest.fixture(scope="session")
def fixed_tokens(tmp_path_factory) -> Path:
    """Tokens of the fixed corpus in tests/assets/corpus: the input of the golden loss files."""
    out = tmp_path_factory.mktemp("fixed") / "tokens.h5"
    cfg = compose("prepare_data", ["experiment=smoke", f"data.corpus={REPO}/tests/assets/corpus/*.txt", f"io.tokens={out}"])
    prepare_data.run(cfg)
    return out
