"""prepare_data / stage_data on real text, and the pure-function batch sampler over token shards."""

from __future__ import annotations

import json
import logging
import shutil
from pathlib import Path

import h5py
import numpy as np
import pytest
import torch

from tests.conftest import make_config
from tests.support import step_batch
from trainflow.data.corpus import shard_groups
from trainflow.data.documents import Documents
from trainflow.data.index import TokenIndex, read_index
from trainflow.data.record import DataError, record_path
from trainflow.data.sampler import TokenSampler
from trainflow.data.stream import DataStream, migrated
from trainflow.data.tokenizer import ByteTokenizer, train_bpe
from trainflow.data.tokens import write_shard
from trainflow.stage import StageError
from trainflow.stages import prepare_data, stage_data


def shard0(index):
    return index.parent / "shard-00000.h5"


def test_token_index_and_shard_record_their_provenance(tokens):
    index = json.loads(tokens.read_text())
    assert index["tokenizer"]["kind"] == "byte" and index["tokenizer"]["vocab_size"] == 257
    assert index["dtype"] == "uint16" and len(index["shards"]) == 1
    with h5py.File(shard0(tokens)) as f:
        assert f.attrs["tokenizer"] == "byte" and f.attrs["vocab_size"] == 257 and f["train"].dtype == np.uint16
        assert index["train_tokens"] == f.attrs["train_tokens"] == len(f["train"]) > 100_000
        assert index["val_tokens"] == f.attrs["val_tokens"] == len(f["val"]) > 1000
        assert f.attrs["train_documents"] > 0 and f.attrs["val_documents"] > 0 and f["train"].chunks is not None
        assert shard0(tokens).stat().st_size == index["shards"][0]["bytes"]
        # Real text: the bytes decode back to Python source.
        text = bytes(f["train"][:2000].astype(np.uint8)).decode("utf-8", errors="replace")
        assert "def " in text or "import " in text


def test_the_index_reads_back_as_a_token_index(tokens):
    index = read_index(tokens, rerun="prepare_data")
    assert (
        isinstance(index, TokenIndex)
        and index.tokenizer.eot_id == json.loads(tokens.read_text())["tokenizer"]["eot_id"]
    )
    assert [s.path for s in index.shard_files(tokens.parent)] == [shard0(tokens)]
    assert index.sources[0].shards == [index.shards[0].name] and index.train_tokens == index.shards[0].train_tokens


@pytest.mark.parametrize(
    ("change", "message"),
    [
        (lambda d: d["shards"][0].update(bytes="12"), r"index\.json\.shards\[0\]\.bytes holds '12', not a int"),
        (lambda d: d["tokenizer"].pop("eot_id"), r"index\.json\.tokenizer lacks TokenizerFacts's field 'eot_id'"),
        (lambda d: d.update(weights={}), r"index\.json holds 'weights', which TokenIndex has no field for"),
        (lambda d: d["sources"][0].update(shards="shard-00000.h5"), r"index\.json\.sources\[0\]\.shards holds str"),
        (lambda d: d.update(version=1), r"index\.json: version 1, not 2"),
    ],
)
def test_an_altered_index_is_one_line_naming_the_file_and_the_field(tokens, tmp_path, change, message):
    data = json.loads(tokens.read_text())
    change(data)
    path = tmp_path / "index.json"
    path.write_text(json.dumps(data))
    with pytest.raises(DataError, match=message) as err:
        read_index(path, rerun="prepare_data")
    assert "\n" not in str(err.value) and str(err.value).endswith("rerun prepare_data")


def source_corpus(tmp_path, names=("os", "json", "random", "string", "textwrap", "shutil")):
    corpus = tmp_path / "corpus"
    corpus.mkdir()
    for name in names:
        source = __import__(name).__file__
        (corpus / f"{name}.txt").write_text(open(source, encoding="utf-8").read())
    return corpus


def test_bpe_trains_once_on_a_bounded_sample(tmp_path):
    corpus = source_corpus(tmp_path)
    first = sorted(corpus.iterdir())[0]  # the sample stops after the document that reaches the bound
    out = tmp_path / "tokens" / "index.json"
    cfg = make_config(
        "prepare_data",
        tmp_path,
        "data=stdlib_bpe",
        f"data.corpus={corpus}/*.txt",
        "data.vocab_size=300",
        f"data.bpe_sample_bytes={len(first.read_text().encode())}",
        f"io.tokens={out}",
        f"io.tokenizer={out.parent}/tokenizer.json",
    )
    prepare_data.run(cfg)
    expected = train_bpe([first.read_text()], 300).to_json()
    assert (out.parent / "tokenizer.json").read_text() == expected
    with h5py.File(shard0(out)) as f:
        assert f.attrs["tokenizer"] == "bpe" and f.attrs["vocab_size"] == 300
        assert f["train"][:].max() < 300 and f.attrs["tokenizer_json"] == expected


def test_empty_glob_is_one_clear_error(tmp_path):
    cfg = make_config("prepare_data", tmp_path, f"data.corpus={tmp_path}/nothing/*.txt")
    with pytest.raises(DataError, match="matched no files"):
        prepare_data.run(cfg)
    assert not (tmp_path / "capacity").exists()


def test_batches_are_a_pure_function_of_seed_and_step(tokens):
    a = TokenSampler(tokens, seq_len=16, seed=7)
    b = TokenSampler(tokens, seq_len=16, seed=7)
    x1, y1 = step_batch(a, 3, 8, slice(0, 8))
    x2, y2 = step_batch(b, 3, 8, slice(0, 8))
    assert torch.equal(x1, x2) and torch.equal(y1, y2)
    assert torch.equal(x1[:, 1:], y1[:, :-1])  # targets are the next tokens
    # Data-parallel ranks take disjoint rows of the same global batch.
    halves = [step_batch(a, 3, 8, slice(r * 4, (r + 1) * 4))[0] for r in range(2)]
    assert torch.equal(torch.cat(halves), x1)
    assert not torch.equal(step_batch(a, 4, 8, slice(0, 8))[0], x1)
    # a reads step 5 ahead in the background while returning step 4; b reads it when asked: the same batch.
    stream = DataStream(migrated(4, [], batch=8, weights={"corpus": 1.0}, seed=7), weights={"corpus": 1.0}, seed=7)
    a.train(stream.take(8), slice(0, 8), block=8, ahead=stream.peek(8))
    a.evaluation(0, 8, slice(0, 8))  # an evaluation between steps keeps step 5's read in flight
    assert a.ahead is not None and a.ahead[0][0] == 40
    assert torch.equal(a.train(stream.take(8), slice(0, 8), block=8)[0], step_batch(b, 5, 8, slice(0, 8))[0])
    a.close(), b.close()


def test_windows_can_be_kept_inside_one_document(tokens):
    """train.cross_document=false: no window's inputs hold an end-of-document token, the draws are still a pure
    function of (seed, step, row), and documents shorter than any window are refused naming the fix."""
    inside = TokenSampler(tokens, seq_len=16, seed=7, cross_document=False)
    again = TokenSampler(tokens, seq_len=16, seed=7, cross_document=False)
    eot = inside.eot_id
    x, _ = step_batch(inside, 3, 8, slice(0, 8))
    assert not (x == eot).any() and torch.equal(x, step_batch(again, 3, 8, slice(0, 8))[0])
    assert torch.equal(step_batch(again, 3, 8, slice(4, 8))[0], x[4:])  # a dp rank's rows, drawn alone
    # 100 windows of 1000 tokens: some cross a document boundary when that is allowed.
    wide = TokenSampler(tokens, seq_len=1000, seed=1)
    assert (step_batch(wide, 0, 100, slice(0, 100))[0] == eot).any()
    long = TokenSampler(tokens, seq_len=2000, seed=1, cross_document=False)
    long.eot_id = ord("\n")  # as if every line of the byte-tokenised source were a document: none holds a window
    with pytest.raises(DataError, match=r"documents are shorter than a window; set train.cross_document=true"):
        long.evaluation(0, 1, slice(0, 1))
    for s in (inside, again, wide, long):
        s.close()


def test_shard_groups_are_contiguous_non_empty_and_balanced(tmp_path):
    files = []
    for i, size in enumerate([900, 100, 100, 100, 500, 500, 50, 950]):
        files.append(str(tmp_path / f"{i}.txt"))
        (tmp_path / f"{i}.txt").write_bytes(b"x" * size)
    groups = shard_groups(files, 3)
    assert [f for g in groups for f in g] == files and all(groups)
    assert [sum(len(open(f).read()) for f in g) for g in groups] == [1100, 1100, 1000]
    assert [len(g) for g in shard_groups(files, 8)] == [1] * 8
    with pytest.raises(DataError, match=r"data.shards\(9\) exceeds the 8 files"):
        shard_groups(files, 9)


@pytest.fixture(scope="module")
def three_shards(tmp_path_factory):
    root = tmp_path_factory.mktemp("shards")
    corpus = source_corpus(root)
    out = root / "tokens" / "index.json"
    cfg = make_config("prepare_data", root, f"data.corpus={corpus}/*.txt", "data.shards=3", f"io.tokens={out}")
    return cfg, prepare_data.run(cfg)


def test_a_window_crosses_shards_and_batches_read_the_concatenated_shards(three_shards):
    cfg, summary = three_shards
    index = json.loads(open(cfg.io.tokens).read())
    split_tokens = {"train_tokens": index["train_tokens"], "val_tokens": index["val_tokens"]}
    assert summary.figures == {**split_tokens, "shards": 3, "remade": 3}
    folder = Path(cfg.io.tokens).parent
    arrays = []
    for entry in index["shards"]:
        with h5py.File(folder / entry["name"]) as f:
            arrays.append(f["train"][:])
            assert entry["train_tokens"] == len(arrays[-1]) > 0
    whole = np.concatenate(arrays)
    sampler = TokenSampler(cfg.io.tokens, seq_len=32, seed=3)
    boundary = len(arrays[0])
    assert np.array_equal(sampler.sources[0].read("train", boundary - 5, 33), whole[boundary - 5 : boundary + 28])
    x, y = step_batch(sampler, 11, 6, slice(0, 6))
    starts = np.random.default_rng((3, 0, 11)).integers(0, len(whole) - 33, size=6)
    assert torch.equal(x, torch.from_numpy(np.stack([whole[s : s + 32] for s in starts]).astype(np.int64)))
    assert torch.equal(y[:, -1], torch.from_numpy(whole[starts + 32].astype(np.int64)))
    sampler.close()


def test_a_stage_run_alone_remakes_only_missing_shards(three_shards):
    cfg, _ = three_shards
    folder = Path(cfg.io.tokens).parent
    before = {p.name: p.stat().st_mtime_ns for p in folder.glob("shard-*.h5")}
    (folder / "shard-00001.h5").unlink()
    assert prepare_data.run(cfg).figures["remade"] == 1
    after = {p.name: p.stat().st_mtime_ns for p in folder.glob("shard-*.h5")}
    assert after["shard-00000.h5"] == before["shard-00000.h5"] and after["shard-00002.h5"] == before["shard-00002.h5"]


def test_stage_data_copies_verifies_skips_identical_and_resumes(three_shards, tmp_path):
    cfg, _ = three_shards
    src = Path(cfg.io.tokens)
    dst = tmp_path / "fast" / "index.json"
    first = stage_data.stage_shards(src, dst, streams=2).figures
    assert first["copied"] == 3 and json.loads(dst.read_text()) == json.loads(src.read_text())
    for name in ("shard-00000.h5", "shard-00001.h5", "shard-00002.h5"):
        assert (dst.parent / name).read_bytes() == (src.parent / name).read_bytes()
    TokenSampler(dst, seq_len=16, seed=0).close()
    assert stage_data.stage_shards(src, dst, streams=2).figures == {**first, "copied": 0, "kept": 3}
    # A kill mid-copy: one shard half-written under its temporary name, one damaged; the rerun copies those two.
    (dst.parent / "shard-00001.h5").rename(dst.parent / "shard-00001.h5.tmp")
    with open(dst.parent / "shard-00001.h5.tmp", "r+b") as f:
        f.truncate(1000)
    with open(dst.parent / "shard-00002.h5", "r+b") as f:
        f.seek(100)
        f.write(b"\xff")
    (dst.parent / "shard-00007.h5").write_bytes(b"a shard of an earlier corpus")
    again = stage_data.stage_shards(src, dst, streams=2).figures
    assert again["copied"] == 2 and again["kept"] == 1
    assert sorted(p.name for p in dst.parent.iterdir()) == sorted(p.name for p in src.parent.iterdir())


def test_a_copy_that_reads_back_wrong_is_made_once_more_then_named(three_shards, tmp_path, monkeypatch):
    cfg, _ = three_shards
    src, dst = Path(cfg.io.tokens), tmp_path / "fast" / "index.json"
    copy, calls = stage_data.copy_file, []

    def flaky(source, tmp, *, fail_times):
        copy(source, tmp)
        calls.append(tmp.name)
        if calls.count(tmp.name) <= fail_times:
            with open(tmp, "r+b") as f:  # the file system hands back a flipped byte
                f.write(b"\x00\x01")

    monkeypatch.setattr(stage_data, "copy_file", lambda *a: flaky(*a, fail_times=1))
    assert stage_data.stage_shards(src, dst, streams=1).figures["copied"] == 3 and len(calls) == 6
    shutil.rmtree(dst.parent)
    calls.clear()
    monkeypatch.setattr(stage_data, "copy_file", lambda *a: flaky(*a, fail_times=2))
    with pytest.raises(StageError, match=r"shard-00000.h5 read back wrong after two copies") as err:
        stage_data.stage_shards(src, dst, streams=1)
    assert "\n" not in str(err.value)
    assert not dst.exists() and not list(dst.parent.glob("shard-00000.h5*"))


def test_stage_data_checks_free_space_before_copying(three_shards, tmp_path, monkeypatch):
    cfg, _ = three_shards
    src, dst = Path(cfg.io.tokens), tmp_path / "fast" / "index.json"
    need = sum(e["bytes"] for e in json.loads(src.read_text())["shards"])
    monkeypatch.setattr(stage_data, "free_bytes", lambda folder: need - 1)
    with pytest.raises(StageError, match=rf"needs {need} more bytes but {need - 1} are free"):
        stage_data.stage_shards(src, dst, streams=2)
    assert not dst.parent.exists()


def test_a_corpus_smaller_than_one_window_fails_in_prepare_data_and_publishes_no_index(tmp_path):
    corpus = tmp_path / "corpus"
    corpus.mkdir()
    for name in ("a", "b"):
        (corpus / f"{name}.txt").write_text("tiny\n")
    out = tmp_path / "capacity" / "index.json"
    cfg = make_config("prepare_data", tmp_path, f"data.corpus={corpus}/*.txt", f"io.tokens={out}")
    with pytest.raises(DataError) as err:
        prepare_data.run(cfg)
    message = str(err.value)
    assert "gave 6 training and 6 validation tokens" in message and "model.seq_len + 2 = 130" in message
    assert "\n" not in message
    assert not out.exists() and not record_path(out).exists()


def test_a_failed_shard_write_leaves_no_temporary_file(tmp_path):
    (tmp_path / "a.txt").write_text("some text")
    out = tmp_path / "out" / "shard-00000.h5"
    docs = Documents([str(tmp_path / "a.txt")])
    with pytest.raises(TypeError):
        write_shard(
            out,
            docs,
            ByteTokenizer(),
            val_fraction=0.1,
            chunk=8,
            attrs={"bad": object()},
            log=logging.getLogger("test"),
        )
    assert list(out.parent.iterdir()) == []


def truncate(path, keep: int) -> None:
    with open(path, "r+b") as f:
        f.truncate(keep)


def test_stage_data_refuses_a_damaged_capacity_tier_shard(tokens, tmp_path):
    src = tmp_path / "capacity" / "index.json"
    shutil.copytree(tokens.parent, src.parent)
    with open(shard0(src), "r+b") as f:
        f.seek(200)
        f.write(b"\xfe")
    dst = tmp_path / "fast" / "index.json"
    with pytest.raises(StageError, match=r"it is damaged: rerun prepare_data \(snakemake --forcerun prepare_data\)"):
        stage_data.stage_shards(src, dst, streams=1)
    assert not dst.exists() and not list(dst.parent.glob("shard-*.h5"))


def test_training_names_a_damaged_staged_shard_and_the_rerun(tokens, tmp_path):
    dst = tmp_path / "fast" / "index.json"
    stage_data.stage_shards(tokens, dst, streams=1)
    assert json.loads(record_path(shard0(dst)).read_text()) == json.loads(record_path(shard0(tokens)).read_text())
    TokenSampler(dst, seq_len=16, seed=0).close()
    truncate(shard0(dst), 4096)
    with pytest.raises(
        DataError, match=rf"{shard0(dst)} holds 4096 bytes but \d+ were recorded; it is damaged: rerun stage_data"
    ):
        TokenSampler(dst, seq_len=16, seed=0)
    record_path(shard0(dst)).write_text(json.dumps({"bytes": 4096, "crc32c": 0}))  # a record matching the damage
    with pytest.raises(DataError, match=rf"{shard0(dst)} cannot be read as HDF5 .*rerun stage_data"):
        TokenSampler(dst, seq_len=16, seed=0)
