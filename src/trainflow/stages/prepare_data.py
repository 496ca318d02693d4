"""Tokenise a corpus, or each corpus of a mixture, into token shards and their index on the capacity tier.

    python -m trainflow.stages.prepare_data data.corpus='/data/fineweb/*.parquet' data.tokenizer=bpe data.shards=4
    python -m trainflow.stages.prepare_data data=stdlib_mix

Which job it is, `job=` says (the workflow runs each as a job of its own):
    job=tokenizer      train the BPE once (io.tokenizer), on a sample of data.bpe_sample_bytes spread over the shards
    job=shard-NNNNN    tokenise shard N's group of files into io.token_shard, with io.tokenizer's BPE; the shards of a
                       mixture (data.sources) are numbered across its sources (data.corpus.shard_plan)
    (no job)           gather the shards beside io.tokens into the index (data.index); run alone, it first makes
                       the tokenizer and every shard that is missing or was made from other settings
"""

from __future__ import annotations

import time
from pathlib import Path

import h5py

from trainflow.atomic import write_text_atomic
from trainflow.config import DataConfig, TrainflowConfig
from trainflow.config.run_folder import shard_name
from trainflow.config.sources import SourceConfig
from trainflow.data.corpus import shard_plan
from trainflow.data.documents import Documents
from trainflow.data.index import shard_recipe, write_index
from trainflow.data.record import DataError, check_size
from trainflow.data.tokenizer import ByteTokenizer, HfTokenizer, load_pretrained, load_tokenizer, train_bpe
from trainflow.data.tokens import write_shard
from trainflow.energy.metrics import StageFigures
from trainflow.stage import stage_log, stage_main

log = stage_log(__file__)


Plan = list[tuple[SourceConfig, list[str]]]
"""Every shard's source and files (data.corpus.shard_plan)."""


def documents(data: DataConfig, source: SourceConfig, files: list[str], max_bytes: int) -> Documents:
    return Documents(files, text_field=source.text_field, bad_lines=data.bad_lines, max_bytes=max_bytes)


def shard_max_bytes(data: DataConfig, source: SourceConfig) -> int:
    """data.max_bytes is each source's budget, split evenly over its shards (0 = no limit)."""
    return -(-data.max_bytes // source.shards)


def bpe_sample(data: DataConfig, plan: Plan) -> list[str]:
    """The documents BPE trains on: the first data.bpe_sample_bytes / shards of each shard's text."""
    per_shard = -(-data.bpe_sample_bytes // len(plan))
    return [
        d.text
        for source, files in plan
        for d in documents(data, source, files, min(per_shard, shard_max_bytes(data, source) or per_shard))
    ]


def train_tokenizer(data: DataConfig, plan: Plan, out: Path) -> HfTokenizer:
    start = time.perf_counter()
    sample = bpe_sample(data, plan)
    tokenizer = train_bpe(sample, data.vocab_size)
    if tokenizer.vocab_size != data.vocab_size:
        raise DataError(
            f"the bpe tokenizer learned {tokenizer.vocab_size} tokens, not data.vocab_size({data.vocab_size}); the "
            "sample is too small for that vocabulary: lower data.vocab_size or raise data.bpe_sample_bytes"
        )
    write_text_atomic(out, tokenizer.to_json())
    log.info(
        "Trained a %d-token BPE on %d documents (%.1f MB) in %.1f s -> %s",
        tokenizer.vocab_size,
        len(sample),
        sum(len(t) for t in sample) / 1e6,
        time.perf_counter() - start,
        out,
    )
    return tokenizer


def shard_tokenizer(data: DataConfig, path: Path) -> ByteTokenizer | HfTokenizer:
    """The tokenizer every shard uses: bytes, the pretrained file, or the BPE trained into `path`."""
    if data.tokenizer == "pretrained":
        return load_pretrained(data.tokenizer_path)
    if data.tokenizer == "byte":
        return ByteTokenizer()
    if not path.is_file():
        raise DataError(f"{path} (the trained BPE) is missing; run the tokenizer job first (snakemake prepare_data)")
    return load_tokenizer("bpe", path.read_text(), origin=str(path))


def prepare_shard(data: DataConfig, plan: Plan, shard: int, out: Path, *, tokenizer_path: Path) -> StageFigures:
    if shard >= len(plan):
        raise DataError(f"job=shard-{shard:05d} is past the {len(plan)} shards of the corpus; give a shard below it")
    start, (source, files) = time.perf_counter(), plan[shard]
    tokenizer = shard_tokenizer(data, tokenizer_path)
    docs = documents(data, source, files, shard_max_bytes(data, source))
    attrs = {"corpus": source.corpus, "source": source.name, "shard": shard, "recipe": shard_recipe(data, *plan[shard])}
    summary = write_shard(
        out, docs, tokenizer, val_fraction=data.val_fraction, chunk=data.chunk_tokens, attrs=attrs, log=log
    )
    seconds = time.perf_counter() - start
    log.info(
        "Tokenised %d documents (%.1f MB of text) of source %s from %d files into %d train + %d val %s tokens with "
        "the %s tokenizer in %.1f s (%.1f MB/s), %d bad lines skipped -> %s",
        docs.documents,
        docs.text_bytes / 1e6,
        source.name,
        len(files),
        summary["train_tokens"],
        summary["val_tokens"],
        summary["dtype"],
        tokenizer.kind,
        seconds,
        docs.text_bytes / 1e6 / max(seconds, 1e-9),
        docs.skipped,
        out,
    )
    return StageFigures(
        {"shard": shard, "source": source.name, "documents": docs.documents, "seconds": seconds, **summary}
    )


def is_current(path: Path, recipe: str) -> bool:
    """A shard already made from these settings and files (its record matches its size)."""
    if not path.is_file():
        return False
    try:
        check_size(path, rerun="prepare_data")
        with h5py.File(path, "r") as f:
            return f.attrs.get("recipe") == recipe
    except (DataError, OSError):
        return False


def prepare_index(data: DataConfig, plan: Plan, out: Path, *, tokenizer_path: Path, min_tokens: int) -> StageFigures:
    """The index of the shards beside `out`; any shard missing or stale (a stage run alone) is made first."""
    shards = [out.parent / shard_name(i) for i in range(len(plan))]
    stale = [(i, p) for i, p in enumerate(shards) if not is_current(p, shard_recipe(data, *plan[i]))]
    if stale and data.tokenizer == "bpe":
        train_tokenizer(data, plan, tokenizer_path)
    for i, path in stale:
        prepare_shard(data, plan, i, path, tokenizer_path=tokenizer_path)
    files = {}
    for source, group in plan:
        files[source.name] = files.get(source.name, 0) + len(group)
    index = write_index(out, shards, data=data, files=files, min_tokens=min_tokens)
    log.info(
        "Indexed %d shards of %s: %d train + %d val tokens (%s), %d remade -> %s",
        len(shards),
        ", ".join(f"{s.name} ({s.corpus}, {s.train_tokens} train tokens)" for s in index.sources),
        index.train_tokens,
        index.val_tokens,
        index.dtype,
        len(stale),
        out,
    )
    figures = {"train_tokens": index.train_tokens, "val_tokens": index.val_tokens}
    return StageFigures({**figures, "shards": len(shards), "remade": len(stale)})


def run(cfg: TrainflowConfig) -> StageFigures:
    # model.seq_len only sets the index's precondition (training's sampler checks it again), so it stays
    # out of prepare_data's config hash: a new model does not re-tokenise.
    data, io = cfg.data, cfg.io
    plan = shard_plan(data)
    if cfg.job == "tokenizer":
        return StageFigures({"vocab_size": train_tokenizer(data, plan, Path(io.tokenizer)).vocab_size})
    if cfg.job:
        shard = int(cfg.job.removeprefix("shard-"))
        return prepare_shard(data, plan, shard, Path(io.token_shard), tokenizer_path=Path(io.tokenizer))
    return prepare_index(
        data, plan, Path(io.tokens), tokenizer_path=Path(io.tokenizer), min_tokens=cfg.model.seq_len + 2
    )


if __name__ == "__main__":
    stage_main(run, config_name="prepare_data")
