"""prepare_data's inputs: JSONL and Parquet corpora (plain, gzip, zstd), bad lines, a pretrained tokenizer.json,
uint32 tokens for large vocabularies, and memory that stays bounded whatever the corpus size."""

from __future__ import annotations

import gzip
import json
import subprocess
import sys
from pathlib import Path

import h5py
import numpy as np
import pyarrow.parquet as pq
import pytest
import zstandard
from tokenizers import Tokenizer, models, pre_tokenizers

from tests.conftest import REPO, make_config
from tests.support import step_batch
from trainflow.config import ConfigError
from trainflow.data.record import DataError
from trainflow.data.sampler import TokenSampler
from trainflow.stages import prepare_data

ASSETS = REPO / "tests/assets/data"
DOCS = [json.loads(line)["text"] for line in (ASSETS / "corpus.jsonl").read_text().splitlines()]


def prepare(tmp_path: Path, corpus: Path | str, *overrides: str) -> Path:
    out = tmp_path / "tokens" / "index.json"
    cfg = make_config(
        "prepare_data", tmp_path, f"data.corpus={corpus}", f"io.tokens={out}", "model.seq_len=32", *overrides
    )
    prepare_data.run(cfg)
    return out.parent / "shard-00000.h5"


def documents(shard: Path, eot: int, bos: int | None = None) -> list[np.ndarray]:
    """Every document of both splits, cut at the end-of-text token (and stripped of a leading BOS)."""
    docs = []
    with h5py.File(shard) as f:
        for split in ("train", "val"):
            tokens = f[split][:]
            for doc in np.split(tokens, np.flatnonzero(tokens == eot) + 1)[:-1]:
                assert bos is None or doc[0] == bos
                docs.append(doc[0 if bos is None else 1 : -1])
    return docs


def byte_texts(shard: Path) -> list[str]:
    return sorted(bytes(d.astype(np.uint8)).decode() for d in documents(shard, 256))


def test_jsonl_with_the_pretrained_tokenizer_takes_its_eos_and_bos_from_the_file(tmp_path):
    tok = str(ASSETS / "tokenizer.json")
    shard = prepare(
        tmp_path,
        ASSETS / "corpus.jsonl",
        "data.tokenizer=pretrained",
        f"data.tokenizer_path={tok}",
        "data.vocab_size=384",
    )
    hf = Tokenizer.from_file(tok)
    expected = sorted(tuple(hf.encode(d, add_special_tokens=False).ids) for d in DOCS)
    got = sorted(tuple(int(t) for t in d) for d in documents(shard, eot=1, bos=0))
    assert got == expected
    with h5py.File(shard) as f:
        assert (f.attrs["eot_id"], f.attrs["bos_id"], f.attrs["dtype"]) == (1, 0, "uint16")
        assert f.attrs["train_documents"] + f.attrs["val_documents"] == len(DOCS)


def test_parquet_and_compressed_jsonl_read_the_same_documents(tmp_path):
    parquet = byte_texts(prepare(tmp_path / "parquet", ASSETS / "corpus.parquet"))
    assert parquet == sorted(pq.read_table(ASSETS / "corpus.parquet")["text"].to_pylist()) == sorted(DOCS)
    raw = (ASSETS / "corpus.jsonl").read_bytes()
    shards = {}
    for suffix, data in (("", raw), (".gz", gzip.compress(raw)), (".zst", zstandard.ZstdCompressor().compress(raw))):
        folder = tmp_path / f"jsonl{suffix}"
        folder.mkdir()
        (folder / f"corpus.jsonl{suffix}").write_bytes(data)
        shards[suffix] = prepare(folder, folder / "*.jsonl*")
    assert byte_texts(shards[""]) == sorted(DOCS)
    for suffix in (".gz", ".zst"):  # the same tokens, split alike: the holdout hashes the name without .gz
        with h5py.File(shards[""]) as a, h5py.File(shards[suffix]) as b:
            assert all(np.array_equal(a[s][:], b[s][:]) for s in ("train", "val"))
    zst_parquet = tmp_path / "pz"
    zst_parquet.mkdir()
    (zst_parquet / "c.parquet.zst").write_bytes(
        zstandard.ZstdCompressor().compress((ASSETS / "corpus.parquet").read_bytes())
    )
    assert byte_texts(prepare(zst_parquet, zst_parquet / "*.zst")) == sorted(DOCS)


def test_a_bad_jsonl_line_fails_naming_file_and_line_or_is_skipped_with_a_count(tmp_path):
    corpus = tmp_path / "c.jsonl"
    lines = (ASSETS / "corpus.jsonl").read_text().splitlines()
    corpus.write_text("\n".join([*lines[:3], "{not json", '{"body": "no text field"}', *lines[3:]]) + "\n")
    with pytest.raises(DataError) as err:
        prepare(tmp_path, corpus)
    assert f"{corpus}:4 is not JSON (" in str(err.value)
    assert "data.bad_lines=skip" in str(err.value) and "\n" not in str(err.value)
    shard = prepare(tmp_path, corpus, "data.bad_lines=skip")
    assert json.loads((shard.parent / "index.json").read_text())["skipped_lines"] == 2
    assert byte_texts(shard) == sorted(DOCS)


def test_a_vocabulary_beyond_uint16_is_stored_and_sampled_as_uint32(tmp_path):
    vocab = {f"w{i}": i for i in range(70_000)} | {"<unk>": 70_000, "<|endoftext|>": 70_001}
    tok = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    tok.save(str(tmp_path / "big.json"))
    words = [f"w{i}" for i in np.random.default_rng(0).integers(0, 70_000, 400)]
    (tmp_path / "c.jsonl").write_text(
        "".join(json.dumps({"text": " ".join(words[i : i + 40])}) + "\n" for i in range(0, 400, 40))
    )
    shard = prepare(
        tmp_path,
        tmp_path / "c.jsonl",
        "data.tokenizer=pretrained",
        f"data.tokenizer_path={tmp_path / 'big.json'}",
        "data.vocab_size=70002",
        "model.dim=16",
        "model.n_heads=2",
        "model.n_kv_heads=2",
        "model.seq_len=8",
    )
    with h5py.File(shard) as f:
        assert f["train"].dtype == np.uint32 and f.attrs["dtype"] == "uint32"
        got = sorted(int(t) for s in ("train", "val") for t in f[s][:] if t != 70_001)
    assert got == sorted(int(w[1:]) for w in words) and max(got) > 65_535
    x, _ = step_batch(TokenSampler(shard.parent / "index.json", seq_len=8, seed=0), 0, 4, slice(0, 4))
    assert x.max() > 65_535


def test_a_pretrained_tokenizer_is_checked_before_anything_runs(tmp_path):
    bad = tmp_path / "bad.json"
    bad.write_text('{"model": "nothing like a tokenizer"}')
    for path, vocab, message in [
        (bad, 384, rf"data.tokenizer_path\('{bad}'\) is no readable tokenizer.json \("),
        (ASSETS / "tokenizer.json", 300, r"data.vocab_size\(300\) must be 384, the size of data.tokenizer_path"),
    ]:
        with pytest.raises(ConfigError, match=message) as err:
            make_config(
                "prepare_data",
                tmp_path,
                "data.tokenizer=pretrained",
                f"data.tokenizer_path={path}",
                f"data.vocab_size={vocab}",
            )
        assert "\n" not in str(err.value)
    tok = f"data.tokenizer_path={ASSETS / 'tokenizer.json'}"
    with pytest.raises(ConfigError, match=r"model.vocab_size\(300\) < data.vocab_size\(384\)"):
        make_config(
            "train_segment", tmp_path, "data.tokenizer=pretrained", tok, "data.vocab_size=384", "model.vocab_size=300"
        )


RSS_SCRIPT = """
import json, sys
from trainflow.config import compose
from trainflow.stages import prepare_data

def status(key):  # kB; VmHWM is the peak of this process image (ru_maxrss would include the forking parent's)
    return int(next(line for line in open("/proc/self/status") if line.startswith(key)).split()[1])

corpus, out = sys.argv[1:]
cfg = compose("prepare_data", ["experiment=smoke", "data.max_bytes=0", f"data.corpus={corpus}", f"io.tokens={out}"])
before = status("VmRSS")
summary = prepare_data.run(cfg)
print(json.dumps({"grew_mb": (status("VmHWM") - before) / 1024, **summary.figures}))
"""


def test_memory_stays_bounded_for_a_corpus_larger_than_the_budget(tmp_path):
    """96 MB of JSONL text (192 MB as uint16 tokens) prepared within a 64 MB budget of resident memory."""
    budget_mb, text_mb = 64, 96
    line = (json.dumps({"text": " ".join(DOCS)[:4000]}) + "\n").encode()
    with open(tmp_path / "big.jsonl.zst", "wb") as raw, zstandard.ZstdCompressor(level=1).stream_writer(raw) as w:
        for _ in range(text_mb * 1_000_000 // len(line) + 1):
            w.write(line)
    out = subprocess.run(
        [sys.executable, "-c", RSS_SCRIPT, str(tmp_path / "*.zst"), str(tmp_path / "tokens/index.json")],
        capture_output=True,
        text=True,
        check=True,
    )
    result = json.loads(out.stdout.splitlines()[-1])
    assert result["train_tokens"] + result["val_tokens"] > text_mb * 1_000_000 * 0.9  # the corpus was read, byte tokens
    assert result["grew_mb"] < budget_mb, result
