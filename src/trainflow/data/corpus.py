"""The corpus's files and their split into shards: which files each prepare_data job tokenises.

    python -c "from trainflow.data.corpus import *; print(shard_groups(corpus_files('<stdlib>/*.py'), 4))"

Files are taken in sorted order and cut into `shards` contiguous groups of about equal size on disk, so a
shard's files are a function of the file list alone (the workflow computes them to declare each shard's
inputs, the shard's job computes them again) and a new file at the end changes only the last shard. A mixture
(data.sources) is cut source by source, and its shards numbered on across the sources in their order
(shard_plan): every shard holds one source's files, and the token files keep one flat layout.
"""

from __future__ import annotations

import glob
import sysconfig
from pathlib import Path

from trainflow.config import DataConfig
from trainflow.config.sources import SourceConfig, source_key, sources_of
from trainflow.data.record import DataError


def corpus_files(corpus: str, *, key: str = "data.corpus") -> list[str]:
    pattern = corpus.replace("<stdlib>", sysconfig.get_paths()["stdlib"])
    files = sorted(f for f in glob.glob(pattern, recursive=True) if Path(f).is_file())
    if not files:
        raise DataError(
            f"{key}({corpus!r}) matched no files; give a glob of text, JSONL or Parquet files, e.g. "
            "'docs/**/*.txt' or 'fineweb/*.parquet'"
        )
    return files


def shard_plan(d: DataConfig) -> list[tuple[SourceConfig, list[str]]]:
    """Every shard of the run, numbered across the sources in order: the source it belongs to and its files."""
    plan = []
    for i, source in enumerate(sources_of(d)):
        files = corpus_files(source.corpus, key=source_key(d, i, "corpus"))
        plan += [(source, group) for group in shard_groups(files, source.shards, key=source_key(d, i, "shards"))]
    return plan


def shard_groups(files: list[str], shards: int, *, key: str = "data.shards") -> list[list[str]]:
    """`files` cut into `shards` contiguous groups: file i goes to the shard in which the middle of its bytes
    falls, so every group is non-empty and the groups' sizes differ by about one file at most."""
    if shards > len(files):
        raise DataError(
            f"{key}({shards}) exceeds the {len(files)} files of its corpus; each shard needs a file: lower {key}"
        )
    sizes = [max(Path(f).stat().st_size, 1) for f in files]
    total, before, previous = sum(sizes), 0, -1
    groups: list[list[str]] = [[] for _ in range(shards)]
    for i, (path, size) in enumerate(zip(files, sizes)):
        ideal = min(shards - 1, (2 * before + size) * shards // (2 * total))
        # Never a shard skipped, never fewer files left than shards left to fill.
        previous = max(min(ideal, previous + 1), previous, shards - (len(files) - i))
        groups[previous].append(path)
        before += size
    return groups
