"""Staging throughput: stage_data's shard copy (parallel streams, CRC-32C of the source while copying, fsync,
the copy re-read and checked, renamed into place) vs `cp` of the same shards, and vs `cp` then `sync`.

    python benchmarks/stage.py [--quick] [--dir /tmp]

Goal: staging >= 0.9x `cp` with the CRC included. The shards are random bytes under an index such as
prepare_data writes (stage_data does not parse them); before every copy both sides' sources are dropped from
the page cache (posix_fadvise DONTNEED after an fsync) and the previous copy is deleted untimed. Each round
times every side once, in an order that rotates; each ratio is the median of the per-round ratios (this
machine is shared and noisy: only copies timed next to each other compare).
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import tempfile
import time
from pathlib import Path

import numpy as np
from _common import drop_cache, emit, log, median

from trainflow.crc import file_crc
from trainflow.data.index import VERSION, ShardEntry, SourceEntry, TokenIndex, TokenizerFacts, write_index_file
from trainflow.data.record import write_record
from trainflow.stages.stage_data import stage_shards


def make_shards(folder: Path, shards: int, mb: int) -> Path:
    rng = np.random.default_rng(0)
    folder.mkdir()
    entries = []
    for i in range(shards):
        path = folder / f"shard-{i:05d}.h5"
        path.write_bytes(rng.integers(0, 256, mb << 20, dtype=np.uint8).tobytes())
        size, crc = file_crc(path)
        write_record(path, size, crc)
        tokens = size // 2  # what stage_data reads of an entry: its name, bytes and CRC; the counts only add up
        entries.append(ShardEntry(path.name, "corpus", tokens, 0, 1, 0, "uint16", 0, size, crc, ["random bytes"]))
    tokens = sum(e.train_tokens for e in entries)
    source = SourceEntry("corpus", "random bytes", shards, tokens, 0, [e.name for e in entries])
    tokenizer = TokenizerFacts("bytes", "0" * 64, 257, 256, 256)
    index = folder / "index.json"
    write_index_file(index, TokenIndex(VERSION, tokenizer, "uint16", tokens, 0, 0, [source], entries))
    return index


def cp_sync(files: list[str], dst: Path) -> None:
    """`cp`, then `sync` of the copies: the baseline with stage_data's durability."""
    subprocess.run(["cp", *files, str(dst)], check=True)
    subprocess.run(["sync", *(str(dst / Path(f).name) for f in files)], check=True)


def timed(fn) -> float:
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="4 shards of 16 MB, 2 rounds")
    parser.add_argument("--dir", default=None, help="where to put the shards (default: the system's temp folder)")
    args = parser.parse_args()
    shards, mb, rounds = (4, 16, 2) if args.quick else (8, 32, 4)
    root = Path(tempfile.mkdtemp(prefix="stage-bench-", dir=args.dir))
    try:
        src = make_shards(root / "capacity", shards, mb)
        files = sorted(str(p) for p in src.parent.glob("shard-*.h5"))
        dst = root / "fast"
        sides = {
            "stage_4_streams": lambda: stage_shards(src, dst / "index.json", streams=4),
            "stage_1_stream": lambda: stage_shards(src, dst / "index.json", streams=1),
            "cp": lambda: subprocess.run(["cp", *files, str(dst)], check=True),
            "cp_sync": lambda: cp_sync(files, dst),
        }
        seconds: dict[str, list[float]] = {name: [] for name in sides}
        for r in range(rounds):
            names = list(sides)[r % len(sides) :] + list(sides)[: r % len(sides)]
            for name in names:
                shutil.rmtree(dst, ignore_errors=True)
                dst.mkdir()
                os.sync()
                drop_cache(sorted(src.parent.glob("shard-*.h5")))
                seconds[name].append(timed(sides[name]))
                log(f"round {r} {name}: {seconds[name][-1]:.2f} s")
        total_mb = shards * mb * 1.048576
        ratio = {
            f"{stage}_vs_{base}": median([b / s for s, b in zip(seconds[stage], seconds[base])])
            for stage in ("stage_4_streams", "stage_1_stream")
            for base in ("cp", "cp_sync")
        }
        emit(
            {
                "benchmark": "stage",
                "goal": "stage_4_streams_vs_cp >= 0.9",
                "shards": shards,
                "shard_mb": mb,
                "rounds": rounds,
                "ratio": {k: round(v, 3) for k, v in ratio.items()},
                "mb_per_s": {k: round(total_mb / median(v), 1) for k, v in seconds.items()},
                "seconds": {k: round(median(v), 3) for k, v in seconds.items()},
            }
        )
    finally:
        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
