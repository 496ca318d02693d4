"""Sharded preparation through the real workflow (data.shards=4): a JSONL corpus with the pretrained tokenizer
and a Parquet corpus run the whole DAG; a failed shard reruns alone, and so does a shard whose file changed."""

from __future__ import annotations

import gzip
import json

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import zstandard

from tests.conftest import REPO, read_json
from tests.support import job_counts, snakemake

ASSETS = REPO / "tests/assets/data"
PROFILE = ("--profile", str(REPO / "profiles/local"))
LINES = (ASSETS / "corpus.jsonl").read_text().splitlines(keepends=True)

pytestmark = pytest.mark.slow


def run_config(corpus: str, *data: str) -> tuple[str, str]:
    return "--config", " ".join(["overrides=experiment=smoke", f"data.corpus={corpus}", "data.shards=4", *data])


def test_jsonl_with_the_pretrained_tokenizer_in_four_shards(tmp_path):
    corpus = tmp_path / "corpus"
    corpus.mkdir()
    parts = [b"".join(line.encode() for line in LINES[i::4]) for i in range(4)]
    (corpus / "a.jsonl").write_bytes(parts[0])
    (corpus / "b.jsonl.gz").write_bytes(gzip.compress(parts[1]))
    (corpus / "c.jsonl.zst").write_bytes(zstandard.ZstdCompressor().compress(parts[2]))
    (corpus / "d.jsonl").write_bytes(b"{broken\n" + parts[3])  # a bad first line: its shard fails
    config = run_config(
        f"{corpus}/*",
        "data.tokenizer=pretrained",
        f"data.tokenizer_path={ASSETS / 'tokenizer.json'}",
        "data.vocab_size=384",
    )
    run = tmp_path / "runs/default"
    index = run / "capacity/data/tokens/index.json"
    failed = snakemake(tmp_path, *PROFILE, *config, "--keep-going", "--", str(index.relative_to(tmp_path)), check=False)
    assert failed.returncode != 0
    assert sorted(p.name for p in index.parent.glob("shard-*.h5")) == [f"shard-0000{i}.h5" for i in range(3)]
    errors = [line for line in (run / "logs/prepare_data/shard-00003.log").read_text().splitlines() if "ERROR" in line]
    assert len(errors) == 1 and f"{corpus}/d.jsonl:1 is not JSON (" in errors[0]

    (corpus / "d.jsonl").write_bytes(parts[3])
    assert job_counts(snakemake(tmp_path, *PROFILE, *config, "-n").output)["prepare_data_shard"] == 1
    snakemake(tmp_path, *PROFILE, *config)
    tokens = read_json(index)
    assert [s["name"] for s in tokens["shards"]] == [f"shard-0000{i}.h5" for i in range(4)]
    assert tokens["tokenizer"] | {"sha256": ""} == {
        "kind": "pretrained",
        "vocab_size": 384,
        "eot_id": 1,
        "bos_id": 0,
        "sha256": "",
    }
    assert sum(s["train_documents"] + s["val_documents"] for s in tokens["shards"]) == len(LINES)
    assert read_json(run / "fast/data/tokens/index.json") == tokens
    assert read_json(run / "verify.json")["failures"] == []

    (corpus / "b.jsonl.gz").write_bytes(gzip.compress(parts[1]))  # rewritten: only its shard is redone
    assert job_counts(snakemake(tmp_path, *PROFILE, *config, "-n").output)["prepare_data_shard"] == 1


def test_parquet_in_four_shards(tmp_path):
    corpus = tmp_path / "corpus"
    corpus.mkdir()
    rows = [json.loads(line)["text"] for line in LINES]
    for i in range(4):
        pq.write_table(pa.table({"text": rows[i::4]}), corpus / f"part-{i}.parquet", row_group_size=2)
    snakemake(tmp_path, *PROFILE, *run_config(f"{corpus}/*.parquet"))
    run = tmp_path / "runs/default"
    tokens = read_json(run / "fast/data/tokens/index.json")
    assert len(tokens["shards"]) == 4 and tokens["tokenizer"]["kind"] == "byte"
    assert tokens["train_tokens"] + tokens["val_tokens"] == sum(len(r.encode()) + 1 for r in rows)
    assert "Validation loss went from" in (run / "report/report.md").read_text()
