"""prepare_data / stage_data on real text, and the pure-function batch sampler."""

from __future__ import annotations

import json
import shutil

import h5py
import numpy as np
import pytest
import torch

from tests.conftest import make_config
from trainflow.data.record import DataError, record_path
from trainflow.data.sampler import TokenSampler
from trainflow.data.tokens import write_tokens
from trainflow.stage import StageError
from trainflow.stages import prepare_data, stage_data


def test_token_file_records_its_provenance(tokens):
    with h5py.File(tokens) as f:
        assert f.attrs["tokenizer"] == "byte" and f.attrs["vocab_size"] == 257
        assert f.attrs["train_tokens"] == len(f["train"]) > 100_000
        assert f.attrs["val_tokens"] == len(f["val"]) > 1000
        assert f["train"].chunks is not None
        sources = list(f.attrs["sources"])
        assert any(s.startswith("val\t") for s in sources) and any(s.startswith("train\t") for s in sources)
        # Real text: the bytes decode back to Python source.
        text = bytes(f["train"][:2000].astype(np.uint8)).decode("utf-8", errors="replace")
        assert "def " in text or "import " in text


def test_bpe_tokenizer_trains_on_the_corpus(tmp_path):
    corpus = tmp_path / "corpus"
    corpus.mkdir()
    for name in ("os", "json", "random", "string", "textwrap", "shutil"):
        source = __import__(name).__file__
        (corpus / f"{name}.txt").write_text(open(source, encoding="utf-8").read())
    out = tmp_path / "bpe.h5"
    cfg = make_config(
        "prepare_data",
        tmp_path,
        "data=stdlib_bpe",
        f"data.corpus={corpus}/*.txt",
        "data.vocab_size=300",
        f"io.tokens={out}",
    )
    prepare_data.run(cfg)
    with h5py.File(out) as f:
        assert f.attrs["tokenizer"] == "bpe" and f.attrs["vocab_size"] == 300
        assert f["train"][:].max() < 300
        assert '"BPE"' in f.attrs["tokenizer_json"]


def test_empty_glob_is_one_clear_error(tmp_path):
    cfg = make_config("prepare_data", tmp_path, f"data.corpus={tmp_path}/nothing/*.txt")
    with pytest.raises(DataError, match="matched no files"):
        prepare_data.run(cfg)
    assert not (tmp_path / "capacity").exists()


def test_batches_are_a_pure_function_of_seed_and_step(tokens):
    a = TokenSampler(tokens, seq_len=16, seed=7)
    b = TokenSampler(tokens, seq_len=16, seed=7)
    x1, y1 = a.batch("train", 3, 8, slice(0, 8))
    x2, y2 = b.batch("train", 3, 8, slice(0, 8))
    assert torch.equal(x1, x2) and torch.equal(y1, y2)
    assert torch.equal(x1[:, 1:], y1[:, :-1])  # targets are the next tokens
    # Data-parallel ranks take disjoint rows of the same global batch.
    halves = [a.batch("train", 3, 8, slice(r * 4, (r + 1) * 4))[0] for r in range(2)]
    assert torch.equal(torch.cat(halves), x1)
    assert not torch.equal(a.batch("train", 4, 8, slice(0, 8))[0], x1)


def test_stage_data_copies_verifies_and_skips_identical(tokens, tmp_path):
    dst = tmp_path / "fast" / "tokens.h5"
    first = stage_data.stage_file(tokens, dst)
    assert first["copied"] and dst.read_bytes() == tokens.read_bytes()
    again = stage_data.stage_file(tokens, dst)
    assert not again["copied"] and again["crc32c"] == first["crc32c"]
    with open(dst, "r+b") as f:  # a damaged fast-tier copy is replaced
        f.seek(100)
        f.write(b"\xff")
    assert stage_data.stage_file(tokens, dst)["copied"]
    with pytest.raises(StageError, match="run prepare_data first"):
        stage_data.stage_file(tmp_path / "missing.h5", dst)


def test_a_corpus_smaller_than_one_window_fails_in_prepare_data_and_leaves_nothing(tmp_path):
    corpus = tmp_path / "corpus"
    corpus.mkdir()
    for name in ("a", "b"):
        (corpus / f"{name}.txt").write_text("tiny\n")
    out = tmp_path / "capacity" / "tokens.h5"
    cfg = make_config("prepare_data", tmp_path, f"data.corpus={corpus}/*.txt", f"io.tokens={out}")
    with pytest.raises(DataError) as err:
        prepare_data.run(cfg)
    message = str(err.value)
    assert "gave 6 training and 6 validation tokens" in message and "model.seq_len + 2 = 130" in message
    assert "\n" not in message
    assert not out.parent.exists() or not list(out.parent.iterdir())


def test_a_failed_token_write_leaves_no_temporary_file(tmp_path):
    out = tmp_path / "tokens.h5"
    with pytest.raises(TypeError):
        write_tokens(out, {"train": [np.arange(10, dtype=np.uint16)]}, eot_id=256, attrs={"bad": object()}, chunk=8)
    assert list(tmp_path.iterdir()) == []


def truncate(path, keep: int) -> None:
    with open(path, "r+b") as f:
        f.truncate(keep)


def test_stage_data_refuses_a_damaged_capacity_tier_file(tokens, tmp_path):
    src = tmp_path / "capacity" / "tokens.h5"
    src.parent.mkdir()
    shutil.copy(tokens, src)
    shutil.copy(record_path(tokens), record_path(src))
    truncate(src, src.stat().st_size // 2)
    dst = tmp_path / "fast" / "tokens.h5"
    with pytest.raises(DataError, match=r"it is damaged: rerun prepare_data \(snakemake --forcerun prepare_data\)"):
        stage_data.stage_file(src, dst)
    assert not dst.parent.exists() or not list(dst.parent.iterdir())


def test_training_names_a_damaged_staged_file_and_the_rerun(tokens, tmp_path):
    dst = tmp_path / "fast" / "tokens.h5"
    stage_data.stage_file(tokens, dst)
    assert json.loads(record_path(dst).read_text()) == json.loads(record_path(tokens).read_text())
    TokenSampler(dst, seq_len=16, seed=0).close()
    truncate(dst, 4096)
    with pytest.raises(
        DataError, match=rf"{dst} holds 4096 bytes but \d+ were recorded; it is damaged: rerun stage_data"
    ):
        TokenSampler(dst, seq_len=16, seed=0)
    record_path(dst).write_text(json.dumps({"bytes": 4096, "crc32c": 0}))  # a record that matches the damage
    with pytest.raises(DataError, match=rf"{dst} cannot be read as HDF5 .*rerun stage_data"):
        TokenSampler(dst, seq_len=16, seed=0)
