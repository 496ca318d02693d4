"""Tokenise a corpus into token shards and their index on the capacity tier.

    python -m trainflow.stages.prepare_data data.corpus='/data/fineweb/*.parquet' data.tokenizer=bpe data.shards=4

Which job it is, `job=` says (the workflow runs each as a job of its own):
    job=tokenizer      train the BPE once (io.tokenizer), on a sample of data.bpe_sample_bytes spread over the shards
    job=shard-NNNNN    tokenise shard N's group of files (data.corpus) into io.token_shard, with io.tokenizer's BPE
    (no job)           gather the shards beside io.tokens into the index (data.index); run alone, it first makes
                       the tokenizer and every shard that is missing or was made from other settings
"""

from __future__ import annotations

import time
from pathlib import Path

import h5py
import hydra
from omegaconf import DictConfig

from trainflow.atomic import write_text_atomic
from trainflow.config import CONF_DIR, DataConfig, TrainflowConfig
from trainflow.config.run_folder import shard_name
from trainflow.data.corpus import corpus_files, shard_groups
from trainflow.data.documents import Documents
from trainflow.data.index import shard_recipe, write_index
from trainflow.data.record import DataError, check_size
from trainflow.data.tokenizer import ByteTokenizer, HfTokenizer, load_pretrained, load_tokenizer, train_bpe
from trainflow.data.tokens import write_shard
from trainflow.stage import run_stage, stage_log

log = stage_log(__file__)


def documents(data: DataConfig, files: list[str], max_bytes: int) -> Documents:
    return Documents(files, text_field=data.text_field, bad_lines=data.bad_lines, max_bytes=max_bytes)


def shard_max_bytes(data: DataConfig) -> int:
    """data.max_bytes is the corpus's budget, split evenly over the shards (0 = no limit)."""
    return -(-data.max_bytes // data.shards)


def bpe_sample(data: DataConfig, groups: list[list[str]]) -> list[str]:
    """The documents BPE trains on: the first data.bpe_sample_bytes / shards of each shard's text."""
    per_shard = -(-data.bpe_sample_bytes // len(groups))
    if data.max_bytes:
        per_shard = min(per_shard, shard_max_bytes(data))
    return [d.text for files in groups for d in documents(data, files, per_shard)]


def train_tokenizer(data: DataConfig, groups: list[list[str]], out: Path) -> HfTokenizer:
    start = time.perf_counter()
    sample = bpe_sample(data, groups)
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


def prepare_shard(data: DataConfig, groups: list[list[str]], shard: int, out: Path, *, tokenizer_path: Path) -> dict:
    if shard >= len(groups):
        raise DataError(f"job=shard-{shard:05d} is past data.shards({data.shards}); give a shard below it")
    start, files = time.perf_counter(), groups[shard]
    tokenizer = shard_tokenizer(data, tokenizer_path)
    docs = documents(data, files, shard_max_bytes(data))
    attrs = {"corpus": data.corpus, "shard": shard, "recipe": shard_recipe(data, files)}
    summary = write_shard(
        out, docs, tokenizer, val_fraction=data.val_fraction, chunk=data.chunk_tokens, attrs=attrs, log=log
    )
    seconds = time.perf_counter() - start
    log.info(
        "Tokenised %d documents (%.1f MB of text) from %d files into %d train + %d val %s tokens with the %s "
        "tokenizer in %.1f s (%.1f MB/s), %d bad lines skipped -> %s",
        docs.documents,
        docs.text_bytes / 1e6,
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
    return {"shard": shard, "documents": docs.documents, "seconds": seconds, **summary}


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


def prepare_index(
    data: DataConfig, groups: list[list[str]], files: int, out: Path, *, tokenizer_path: Path, min_tokens: int
) -> dict:
    """The index of the shards beside `out`; any shard missing or stale (a stage run alone) is made first."""
    shards = [out.parent / shard_name(i) for i in range(len(groups))]
    stale = [(i, p) for i, (p, g) in enumerate(zip(shards, groups)) if not is_current(p, shard_recipe(data, g))]
    if stale and data.tokenizer == "bpe":
        train_tokenizer(data, groups, tokenizer_path)
    for i, path in stale:
        prepare_shard(data, groups, i, path, tokenizer_path=tokenizer_path)
    index = write_index(out, shards, corpus=data.corpus, files=files, min_tokens=min_tokens)
    log.info(
        "Indexed %d shards of %s: %d train + %d val tokens (%s), %d remade -> %s",
        len(shards),
        data.corpus,
        index["train_tokens"],
        index["val_tokens"],
        index["dtype"],
        len(stale),
        out,
    )
    return {
        "split_tokens": {s: index[f"{s}_tokens"] for s in ("train", "val")},
        "shards": len(shards),
        "remade": len(stale),
    }


def run(cfg: TrainflowConfig) -> dict:
    # model.seq_len only sets the index's precondition (training's sampler checks it again), so it stays
    # out of prepare_data's config hash: a new model does not re-tokenise.
    data, io = cfg.data, cfg.io
    files = corpus_files(data.corpus)
    groups = shard_groups(files, data.shards)
    if cfg.job == "tokenizer":
        return {"vocab_size": train_tokenizer(data, groups, Path(io.tokenizer)).vocab_size}
    if cfg.job:
        shard = int(cfg.job.removeprefix("shard-"))
        return prepare_shard(data, groups, shard, Path(io.token_shard), tokenizer_path=Path(io.tokenizer))
    tokens = Path(io.tokens)
    return prepare_index(
        data, groups, len(files), tokens, tokenizer_path=Path(io.tokenizer), min_tokens=cfg.model.seq_len + 2
    )


@hydra.main(version_base="1.3", config_path=str(CONF_DIR), config_name="prepare_data")
def main(raw: DictConfig) -> None:
    run_stage(raw, run)


if __name__ == "__main__":
    main()
