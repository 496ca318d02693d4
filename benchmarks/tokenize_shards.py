"""Tokenisation throughput: prepare_data's shard jobs vs calling `tokenizers`' encode_batch directly.

    python benchmarks/tokenize_shards.py [--quick] [--dir /tmp]

Goals: one shard job >= 0.8x encode_batch on the same text in one process, per core; two shard jobs at
once near 2x one (near-linear in cores for 1 -> 2 workers).

The corpus is the standard library's sources as JSONL documents (repeated to the size asked), in two files;
the tokenizer a 8192-token byte-level BPE trained on them once and saved as a tokenizer.json, used as
data.tokenizer=pretrained. Every side runs with one tokenizer thread (RAYON_NUM_THREADS=1, set before
`tokenizers` loads, in this process and the spawned workers), so "per core" holds. The baseline reads the
documents into memory first (untimed) and times only `encode_batch`; a shard job is timed around
prepare_data's run (reading, decompressing, holding out, tokenising, writing the HDF5 shard). One worker
prepares both shards one after the other; two workers prepare one each at once (wall time from the first
start to the last end). Each round times every side; ratios are medians of the per-round ratios.
"""

from __future__ import annotations

import os
import sys

os.environ["RAYON_NUM_THREADS"] = "1"  # before tokenizers loads: one thread per side
# This file's name is the standard library's `tokenize` (which linecache, inspect and torch import): its folder
# moves behind the standard library on the search path, still ahead of nothing else that names _common.
HERE = os.path.dirname(os.path.abspath(__file__))
sys.path[:] = [p for p in sys.path if os.path.abspath(p or ".") != HERE] + [HERE]

import argparse  # noqa: E402
import json  # noqa: E402
import multiprocessing as mp  # noqa: E402
import shutil  # noqa: E402
import sysconfig  # noqa: E402
import tempfile  # noqa: E402
import time  # noqa: E402
from concurrent.futures import ProcessPoolExecutor  # noqa: E402
from pathlib import Path  # noqa: E402

from _common import emit, log, median  # noqa: E402
from tokenizers import Tokenizer  # noqa: E402

from trainflow.data.tokenizer import train_bpe  # noqa: E402

VOCAB = 8192


def make_corpus(folder: Path, mb: int) -> list[str]:
    """JSONL documents of the standard library's sources, about `mb` MB in two files; the texts."""
    sources = sorted(Path(sysconfig.get_paths()["stdlib"]).glob("*.py"))
    texts, size = [], 0
    while size < mb * 1_000_000:
        for path in sources:
            texts.append(path.read_text(encoding="utf-8", errors="replace"))
            size += len(texts[-1].encode())
            if size >= mb * 1_000_000:
                break
    folder.mkdir()
    for part in range(2):
        with open(folder / f"part-{part}.jsonl", "w") as f:
            for text in texts[part::2]:
                f.write(json.dumps({"text": text}) + "\n")
    return texts


def prepare(corpus: str, tokenizer: str, shard: Path) -> tuple[float, float]:
    """One shard job in this process (one of the corpus's two files): (start, end)."""
    from trainflow.config import compose
    from trainflow.stages import prepare_data

    cfg = compose(
        "prepare_data",
        [
            "experiment=smoke",
            "data.max_bytes=0",
            f"data.corpus={corpus}",
            "data.shards=2",
            "data.tokenizer=pretrained",
            f"data.tokenizer_path={tokenizer}",
            f"data.vocab_size={VOCAB}",
            f"job={shard.stem}",  # one shard job, as the workflow runs it (prepare_data's job=shard-N)
            f"io.token_shard={shard}",
            f"io.tokens={shard.parent / 'index.json'}",
        ],
    )
    start = time.perf_counter()
    prepare_data.run(cfg)
    return start, time.perf_counter()


def one_worker(corpus: str, tokenizer: str, out: Path) -> tuple[float, float]:
    """Both shard jobs, one after the other: the whole corpus (start, end)."""
    runs = [prepare(corpus, tokenizer, out / f"shard-{i:05d}.h5") for i in range(2)]
    return runs[0][0], runs[-1][1]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="2 MB of text, 1 round")
    parser.add_argument("--dir", default=None, help="where to put the corpus (default: the system's temp folder)")
    args = parser.parse_args()
    mb, rounds = (2, 1) if args.quick else (32, 3)
    root = Path(tempfile.mkdtemp(prefix="tokenize-bench-", dir=args.dir))
    try:
        texts = make_corpus(root / "corpus", mb)
        corpus = str(root / "corpus" / "*.jsonl")
        tokenizer = root / "tokenizer.json"
        tokenizer.write_text(train_bpe(texts[: len(texts) // 8], VOCAB).to_json())
        tok = Tokenizer.from_file(str(tokenizer))
        text_mb = sum(len(t.encode()) for t in texts) / 1e6
        mbps: dict[str, list[float]] = {"encode_batch": [], "shard_1_worker": [], "shard_2_workers": []}
        with ProcessPoolExecutor(2, mp_context=mp.get_context("spawn")) as pool:
            for r in range(rounds):
                start = time.perf_counter()
                tok.encode_batch(texts, add_special_tokens=False)
                mbps["encode_batch"].append(text_mb / (time.perf_counter() - start))
                out = root / f"one-{r}"
                out.mkdir()
                start, end = pool.submit(one_worker, corpus, str(tokenizer), out).result()
                mbps["shard_1_worker"].append(text_mb / (end - start))
                out = root / f"two-{r}"
                out.mkdir()  # Snakemake makes an output's folder before a job runs; so does this
                jobs = [pool.submit(prepare, corpus, str(tokenizer), out / f"shard-{i:05d}.h5") for i in range(2)]
                runs = [j.result() for j in jobs]
                wall = max(r[1] for r in runs) - min(r[0] for r in runs)
                mbps["shard_2_workers"].append(text_mb / wall)  # the two jobs: the whole corpus
                log(f"round {r}: " + ", ".join(f"{k} {v[-1]:.2f} MB/s" for k, v in mbps.items()))
        per_round = list(zip(mbps["encode_batch"], mbps["shard_1_worker"], mbps["shard_2_workers"]))
        emit(
            {
                "benchmark": "tokenize_shards",
                "goal": "shard_1_worker_vs_encode_batch >= 0.8; shard_2_workers_vs_1 near 2",
                "text_mb": round(text_mb, 1),
                "vocab_size": VOCAB,
                "rounds": rounds,
                "ratio": {
                    "shard_1_worker_vs_encode_batch": round(median([one / base for base, one, _ in per_round]), 3),
                    "shard_2_workers_vs_1": round(median([two / one for _, one, two in per_round]), 3),
                },
                "mb_per_s": {k: round(median(v), 2) for k, v in mbps.items()},
            }
        )
    finally:
        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
