"""Tokenise a text corpus into a chunked HDF5 file on the capacity tier.

python -m trainflow.stages.prepare_data data.corpus='/data/books/**/*.txt' data.tokenizer=bpe
"""

from __future__ import annotations

import glob
import logging
import sysconfig
import time
from pathlib import Path

import hydra
from omegaconf import DictConfig

from trainflow.config import CONF_DIR, DataConfig, TrainflowConfig
from trainflow.data.record import DataError
from trainflow.data.tokens import BpeTokenizer, ByteTokenizer, is_validation, write_tokens
from trainflow.progress import Progress
from trainflow.stage import run_stage

log = logging.getLogger("trainflow.prepare_data")


def corpus_files(corpus: str) -> list[str]:
    pattern = corpus.replace("<stdlib>", sysconfig.get_paths()["stdlib"])
    files = sorted(f for f in glob.glob(pattern, recursive=True) if Path(f).is_file())
    if not files:
        raise DataError(f"data.corpus({corpus!r}) matched no files; give a glob of text files, e.g. 'docs/**/*.txt'")
    return files


def read_corpus(files: list[str], max_bytes: int) -> tuple[list[str], list[str]]:
    """Documents (one per file) and their paths, stopping after max_bytes (0 = all)."""
    texts, paths, total = [], [], 0
    progress = Progress(log, "Read", len(files), unit="files")
    for i, path in enumerate(files):
        text = Path(path).read_text(encoding="utf-8", errors="replace")
        if text.strip():
            texts.append(text)
            paths.append(path)
            total += len(text.encode("utf-8"))
        progress.update(i + 1)
        if max_bytes and total >= max_bytes:
            break
    if not texts:
        raise DataError(f"every file matched by data.corpus ({len(files)}) is empty; point data.corpus at text files")
    return texts, paths


def tokenize(data: DataConfig, out: Path, *, min_tokens: int) -> dict:
    """Tokenise data.corpus into `out`; each split must hold `min_tokens` (one training window)."""
    start = time.perf_counter()
    texts, paths = read_corpus(corpus_files(data.corpus), data.max_bytes)
    tokenizer = BpeTokenizer.train(texts, data.vocab_size) if data.tokenizer == "bpe" else ByteTokenizer()
    if tokenizer.vocab_size != data.vocab_size:
        raise DataError(
            f"the {data.tokenizer} tokenizer learned {tokenizer.vocab_size} tokens, not "
            f"data.vocab_size({data.vocab_size}); the corpus is too small for that vocabulary: lower data.vocab_size"
        )
    held_out = [is_validation(p, data.val_fraction) for p in paths]
    if all(held_out) or not any(held_out):
        # Tiny corpora: hash-based holdout can leave one side empty; hold out the last document instead.
        held_out = [False] * (len(paths) - 1) + [True]
    encoded = tokenizer.encode_batch(texts)
    splits = {
        "train": [e for e, v in zip(encoded, held_out) if not v],
        "val": [e for e, v in zip(encoded, held_out) if v],
    }
    counts = {split: int(sum(len(d) + 1 for d in docs)) for split, docs in splits.items()}
    if min(counts.values()) < min_tokens:
        raise DataError(
            f"data.corpus({data.corpus!r}) gave {counts['train']} training and {counts['val']} validation tokens; each "
            f"split needs one window of model.seq_len + 2 = {min_tokens}: add text, raise data.max_bytes or lower "
            "model.seq_len"
        )
    attrs = {
        "tokenizer": data.tokenizer,
        "tokenizer_json": tokenizer.to_json(),
        "vocab_size": tokenizer.vocab_size,
        "eot_id": tokenizer.eot_id,
        "corpus": data.corpus,
        "source_bytes": sum(len(t.encode("utf-8")) for t in texts),
        "sources": [f"{'val' if v else 'train'}\t{p}" for p, v in zip(paths, held_out)],
    }
    write_tokens(out, splits, eot_id=tokenizer.eot_id, attrs=attrs, chunk=data.chunk_tokens)
    seconds = time.perf_counter() - start
    log.info(
        "Tokenised %d documents (%.1f MB) into %d train + %d val tokens with the %s tokenizer in %.1f s -> %s",
        len(texts),
        attrs["source_bytes"] / 1e6,
        counts["train"],
        counts["val"],
        data.tokenizer,
        seconds,
        out,
    )
    return {"documents": len(texts), "source_bytes": attrs["source_bytes"], "tokens": counts}


def run(cfg: TrainflowConfig) -> dict:
    # model.seq_len only sets this precondition (training's sampler checks it again), so it stays out
    # of prepare_data's config hash: a new model does not re-tokenise.
    return tokenize(cfg.data, Path(cfg.io.tokens), min_tokens=cfg.model.seq_len + 2)


@hydra.main(version_base="1.3", config_path=str(CONF_DIR), config_name="prepare_data")
def main(raw: DictConfig) -> None:
    run_stage(raw, run)


if __name__ == "__main__":
    main()
