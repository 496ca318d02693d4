"""The index of a corpus's token shards: what training and staging read to find, check and size them.

    python -c "from trainflow.data.index import read_index; print(read_index('index.json', rerun='x'))"

index.json lies beside its shards:

    {"version": 1, "corpus": "<glob>", "files": 168, "tokenizer": {"kind", "sha256", "vocab_size", "eot_id",
     "bos_id"}, "dtype": "uint16", "train_tokens": n, "val_tokens": n, "skipped_lines": n,
     "shards": [{"name": "shard-00000.h5", "train_tokens", "val_tokens", "train_documents", "val_documents",
                 "dtype", "bytes", "crc32c", "sources": ["<file>\\t<documents>", ...]}, ...]}

The shards' bytes and CRC-32C come from their records (data.record), written when each shard was; the index has
its own record too (index.json.crc.json), which the sampler checks on open.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from pathlib import Path

import h5py

from trainflow.config import DataConfig, as_dict
from trainflow.config.run_folder import shard_name
from trainflow.data.record import DataError, read_record, recorded

VERSION = 1
RERUN = "prepare_data (snakemake --forcerun prepare_data)"


def shard_recipe(data: DataConfig, files: list[str]) -> str:
    """A hash of what a shard is made from (the data settings and its files): a shard that records another
    recipe is stale."""
    blob = json.dumps({"data": as_dict(data), "files": files}, sort_keys=True)
    return hashlib.sha256(blob.encode()).hexdigest()


def shard_entry(path: Path) -> dict:
    """One shard's line of the index, from its attributes and its record."""
    size, crc = read_record(path, rerun=RERUN)
    try:
        with h5py.File(path, "r") as f:
            a = f.attrs
            entry = {k: int(a[k]) for k in ("train_tokens", "val_tokens", "train_documents", "val_documents")}
            entry |= {"dtype": str(a["dtype"]), "skipped_lines": int(a["skipped_lines"])}
            tokenizer = {
                "kind": str(a["tokenizer"]),
                "sha256": str(a["tokenizer_sha256"]),
                **{k: int(a[k]) for k in ("vocab_size", "eot_id", "bos_id")},
            }
            sources = [s.decode() if isinstance(s, bytes) else s for s in f["sources"][:]]
    except (OSError, KeyError) as err:
        raise DataError(f"{path} is no token shard or lacks its attributes ({err}); rerun {RERUN}") from err
    return {"name": path.name, **entry, "bytes": size, "crc32c": crc, "sources": sources, "tokenizer": tokenizer}


def write_index(out: Path, shards: list[Path], *, corpus: str, files: int, min_tokens: int) -> dict:
    """Gather the shards' entries into `out`; every split must hold `min_tokens` (one training window)."""
    entries = [shard_entry(p) for p in shards]
    tokenizers = {json.dumps(e.pop("tokenizer"), sort_keys=True) for e in entries}
    if len(tokenizers) != 1:
        raise DataError(f"the shards beside {out} were made by {len(tokenizers)} different tokenizers; rerun {RERUN}")
    totals = {f"{s}_tokens": sum(e[f"{s}_tokens"] for e in entries) for s in ("train", "val")}
    if min(totals.values()) < min_tokens:
        raise DataError(
            f"data.corpus({corpus!r}) gave {totals['train_tokens']} training and {totals['val_tokens']} validation "
            f"tokens; each split needs one window of model.seq_len + 2 = {min_tokens}: add text, raise data.max_bytes "
            "or lower model.seq_len"
        )
    index = {
        "version": VERSION,
        "corpus": corpus,
        "files": files,
        "tokenizer": json.loads(tokenizers.pop()),
        "dtype": entries[0]["dtype"],
        **totals,
        "skipped_lines": sum(e["skipped_lines"] for e in entries),
        "shards": entries,
    }
    write_index_file(out, index)
    return index


def write_index_file(out: Path, index: dict) -> None:
    """Write an index atomically with its size and CRC-32C beside it (data.record), as every token file has."""
    with recorded(out) as tmp:
        tmp.write_text(json.dumps(index, indent=1, sort_keys=True) + "\n")


@dataclass(frozen=True)
class Shard:
    path: Path
    train_tokens: int
    val_tokens: int
    bytes: int
    crc32c: int


def read_index(path: str | Path, *, rerun: str) -> tuple[dict, list[Shard]]:
    """The index and its shards (paths beside it); missing or unreadable, one DataError saying to rerun `rerun`."""
    path = Path(path)
    try:
        index = json.loads(path.read_text())
        if index["version"] != VERSION:
            raise ValueError(f"version {index['version']}, not {VERSION}")
        shards = [
            Shard(path.parent / e["name"], e["train_tokens"], e["val_tokens"], e["bytes"], e["crc32c"])
            for e in index["shards"]
        ]
    except (OSError, ValueError, KeyError, TypeError) as err:
        raise DataError(
            f"{path} (the index of the token shards) is missing or unreadable ({err}); rerun {rerun}"
        ) from err
    return index, shards


def first_shard(index: str | Path) -> Path:
    """The first shard beside an index (where the tokenizer's JSON is recorded, data.tokens)."""
    return Path(index).parent / shard_name(0)
