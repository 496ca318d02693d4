"""data.sources: two corpora whose bytes tell them apart (letters, digits), weighted 0.25 / 0.75. The rows of 200
training batches, classified by their tokens (not by the sampler's own bookkeeping), give each source its weight's
share within 2 %, the same rows for every data-parallel split and a fresh sampler (resume); each source has its own
validation split; a weight change does not re-tokenise; bad mixtures fail in one line, writing nothing."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch

from tests.conftest import make_config
from tests.support import WEIGHTS, mixture, prepare_mixture, step_batch, write_corpora
from trainflow.config import ConfigError, stage_hash
from trainflow.config.run_folder import shard_name
from trainflow.data.index import write_index
from trainflow.data.mixture import realised
from trainflow.data.record import DataError
from trainflow.data.sampler import TokenSampler
from trainflow.data.stream import DataStream, StreamPosition
from trainflow.stages import prepare_data

LETTERS, DIGITS = set(b"abcdefghijklm"), set(b"0123456789")
SEQ = 32


@pytest.fixture(scope="module")
def index(tmp_path_factory) -> Path:
    return prepare_mixture(tmp_path_factory.mktemp("mix"))[0]


def source_of(row: torch.Tensor) -> str:
    """Which corpus a row's tokens come from: a window never runs from one source into another."""
    tokens = set(row.tolist())
    assert not (tokens & LETTERS and tokens & DIGITS), "a window mixes two sources"
    return "letters" if tokens & LETTERS else "digits"


def test_200_batches_give_each_source_its_weight_the_same_for_every_split_and_resume(index):
    sampler = TokenSampler(index, seq_len=SEQ, seed=1234, weights=WEIGHTS)
    counts, batch, rows = {"letters": 0, "digits": 0}, 16, []
    stream = DataStream(StreamPosition.start(block=batch, names=list(WEIGHTS)), weights=WEIGHTS, seed=1234)
    for _ in range(200):
        step = stream.take(batch)
        inputs, _ = sampler.train(step, slice(0, batch), block=batch)
        rows.append(np.bincount(step.sources, minlength=2).tolist())  # what a step record keeps
        for row in inputs:
            counts[source_of(row)] += 1
    shares = {name: n / (200 * batch) for name, n in counts.items()}
    assert all(abs(shares[n] - w) <= 0.02 * w for n, w in WEIGHTS.items()), shares
    recorded = realised(list(WEIGHTS), list(WEIGHTS.values()), rows=rows, seq_len=SEQ)
    assert [s.tokens for s in recorded] == [counts[n] * SEQ for n in WEIGHTS]  # what the summary records
    resumed = TokenSampler(index, seq_len=SEQ, seed=1234, weights=WEIGHTS)  # a new job, or another layout
    for window in (0, 57, 199):
        whole, _ = step_batch(sampler, window, batch, slice(0, batch))
        for dp in (2, 4):
            rows = batch // dp
            parts = [step_batch(resumed, window, batch, slice(r * rows, (r + 1) * rows))[0] for r in range(dp)]
            assert torch.equal(torch.cat(parts), whole)
    other = TokenSampler(index, seq_len=SEQ, seed=99, weights=WEIGHTS)
    assert not torch.equal(
        step_batch(other, 0, batch, slice(0, batch))[0], step_batch(sampler, 0, batch, slice(0, batch))[0]
    )
    for s in (sampler, resumed, other):
        s.close()


def test_each_source_has_its_own_validation_split(index):
    sampler = TokenSampler(index, seq_len=SEQ, seed=1, weights=WEIGHTS, cross_document=False)
    for k, name in enumerate(sampler.names):
        for i in range(3):
            inputs, _ = sampler.evaluation(i, 8, slice(0, 8), source=k)
            assert {source_of(row) for row in inputs} == {name}
    sampler.close()
    entries = {s["name"]: s for s in json.loads(index.read_text())["sources"]}
    assert entries["letters"]["shards"] == [shard_name(0)] and entries["digits"]["shards"] == [shard_name(1)]
    assert all(entries[n]["val_tokens"] >= SEQ + 2 for n in WEIGHTS)


def test_shards_are_numbered_across_the_sources_and_a_weight_change_does_not_retokenise(tmp_path):
    corpora = write_corpora(tmp_path / "corpora")
    shards = {"letters": 2, "digits": 3}
    cfg = make_config("prepare_data", tmp_path, mixture(corpora, WEIGHTS, shards))
    prepare_data.run(cfg)
    entries = json.loads(Path(cfg.io.tokens).read_text())["shards"]
    assert [e["source"] for e in entries] == ["letters"] * 2 + ["digits"] * 3
    reweighted = make_config("prepare_data", tmp_path, mixture(corpora, {"letters": 0.5, "digits": 0.5}, shards))
    assert stage_hash(reweighted, "prepare_data") == stage_hash(cfg, "prepare_data")
    # The same series: the next segment draws its rows with the new weights, each source from where it stood.
    assert stage_hash(reweighted, "train_segment") == stage_hash(cfg, "train_segment")
    assert prepare_data.run(reweighted).figures["remade"] == 0


def test_weights_that_add_up_to_nothing_are_refused(tmp_path):
    corpora = {"letters": "x", "digits": "y"}
    with pytest.raises(
        ConfigError, match=r"data\.sources' weights \(letters 0, digits 0\) add up to no positive share"
    ):
        make_config("prepare_data", tmp_path, mixture(corpora, {"letters": 0, "digits": 0}))
    with pytest.raises(ConfigError, match=r"data\.sources\[1\]\.weight\(-1\.0\) must be >= 0"):
        make_config("prepare_data", tmp_path, mixture(corpora, {"letters": 1, "digits": -1}))


def test_a_source_with_no_files_fails_naming_it_and_writes_nothing(tmp_path):
    corpora = write_corpora(tmp_path / "corpora") | {"digits": str(tmp_path / "none/*.txt")}
    cfg = make_config("prepare_data", tmp_path, mixture(corpora))
    with pytest.raises(DataError, match=r"^data\.sources\[1\]\.corpus\('.*/none/\*\.txt'\) matched no files; give"):
        prepare_data.run(cfg)
    assert not Path(cfg.io.tokens).parent.exists()


def test_shards_of_different_tokenizers_are_not_indexed_together(index, tmp_path):
    """A shard made by another tokenizer (copied in, or made by hand with job=) beside the others: the gather names
    both shards and their sources, and writes no index."""
    folder = tmp_path / "tokens"
    shutil.copytree(index.parent, folder)
    (folder / "index.json").unlink()
    out = folder / shard_name(1)
    tokenizer = f"data.tokenizer_path={Path(__file__).parents[1] / 'assets/data/tokenizer.json'}"
    other = make_config(
        "prepare_data",
        tmp_path,
        mixture(write_corpora(tmp_path / "c")),
        "data.tokenizer=pretrained",
        tokenizer,
        "data.vocab_size=384",
        "job=shard-00001",
        f"io.token_shard={out}",
    )
    prepare_data.run(other)
    data = make_config("prepare_data", tmp_path, mixture(write_corpora(tmp_path / "d"))).data
    shards = [folder / shard_name(i) for i in range(2)]
    with pytest.raises(
        DataError,
        match=r"shard-00000\.h5 \(source letters\) and shard-00001\.h5 \(source digits\) .*"
        r"different tokenizers \(byte .*, pretrained .*\); the sources of a mixture share one",
    ):
        write_index(folder / "index.json", shards, data=data, files={"letters": 30, "digits": 30}, min_tokens=34)
    assert not (folder / "index.json").exists()


def test_a_staged_index_of_another_mixture_is_refused(index):
    with pytest.raises(DataError, match=r"holds the sources letters, digits but data\.sources names web, code"):
        TokenSampler(index, seq_len=SEQ, seed=0, weights={"web": 0.5, "code": 0.5})
