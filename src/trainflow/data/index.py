"""The index of a corpus's token shards: what training and staging read to find, check and size them.

    python -c "from trainflow.data.index import read_index; print(read_index('index.json', rerun='x'))"

index.json lies beside its shards:

    {"version": 2, "tokenizer": {"kind", "sha256", "vocab_size", "eot_id", "bos_id"}, "dtype": "uint16",
     "train_tokens": n, "val_tokens": n, "skipped_lines": n,
     "sources": [{"name": "corpus", "corpus": "<glob>", "files": 168, "train_tokens", "val_tokens",
                  "shards": ["shard-00000.h5", ...]}, ...],
     "shards": [{"name": "shard-00000.h5", "source": "corpus", "train_tokens", "val_tokens", "train_documents",
                 "val_documents", "dtype", "bytes", "crc32c", "sources": ["<file>\\t<documents>", ...]}, ...]}

Each source of a mixture (data.sources; a plain data.corpus is the one source `corpus`) has its own shards, listed
in its entry; all of them share one tokenizer, or the index is refused. The weights are not here: they are how
training draws (data.mixture), not what was tokenised.

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
from trainflow.config.sources import SourceConfig, source_key, sources_of
from trainflow.data.record import DataError, read_record, recorded

VERSION = 2
RERUN = "prepare_data (snakemake --forcerun prepare_data)"


def shard_recipe(data: DataConfig, source: SourceConfig, files: list[str]) -> str:
    """A hash of what a shard is made from (the shared data settings, its source's but the weight, its files): a
    shard that records another recipe is stale."""
    shared = {k: v for k, v in as_dict(data).items() if k != "sources"}
    own = {k: v for k, v in as_dict(source).items() if k != "weight"}
    blob = json.dumps({"data": shared, "source": own, "files": files}, sort_keys=True)
    return hashlib.sha256(blob.encode()).hexdigest()


def shard_entry(path: Path) -> dict:
    """One shard's line of the index, from its attributes and its record."""
    size, crc = read_record(path, rerun=RERUN)
    try:
        with h5py.File(path, "r") as f:
            a = f.attrs
            entry = {k: int(a[k]) for k in ("train_tokens", "val_tokens", "train_documents", "val_documents")}
            entry |= {"dtype": str(a["dtype"]), "skipped_lines": int(a["skipped_lines"]), "source": str(a["source"])}
            tokenizer = {
                "kind": str(a["tokenizer"]),
                "sha256": str(a["tokenizer_sha256"]),
                **{k: int(a[k]) for k in ("vocab_size", "eot_id", "bos_id")},
            }
            sources = [s.decode() if isinstance(s, bytes) else s for s in f["sources"][:]]
    except (OSError, KeyError) as err:
        raise DataError(f"{path} is no token shard or lacks its attributes ({err}); rerun {RERUN}") from err
    return {"name": path.name, **entry, "bytes": size, "crc32c": crc, "sources": sources, "tokenizer": tokenizer}


def write_index(out: Path, shards: list[Path], *, data: DataConfig, files: dict[str, int], min_tokens: int) -> dict:
    """Gather the shards' entries into `out`; `files` counts each source's input files. Every source's split must
    hold `min_tokens` (one training window), and every shard must come from the one tokenizer."""
    entries = [shard_entry(p) for p in shards]
    tokenizers = {json.dumps(e.pop("tokenizer"), sort_keys=True): e for e in entries}
    if len(tokenizers) != 1:
        (one, a), (other, b) = list(tokenizers.items())[:2]
        raise DataError(
            f"{a['name']} (source {a['source']}) and {b['name']} (source {b['source']}) beside {out} were made by "
            f"different tokenizers ({json.loads(one)['kind']} {json.loads(one)['sha256'][:12]}, "
            f"{json.loads(other)['kind']} {json.loads(other)['sha256'][:12]}); the sources of a mixture share one: "
            f"rerun {RERUN}"
        )
    sources = []
    for i, source in enumerate(sources_of(data)):
        own = [e for e in entries if e["source"] == source.name]
        totals = {f"{s}_tokens": sum(e[f"{s}_tokens"] for e in own) for s in ("train", "val")}
        if min(totals.values()) < min_tokens:
            raise DataError(
                f"{source_key(data, i, 'corpus')}({source.corpus!r}) gave {totals['train_tokens']} training and "
                f"{totals['val_tokens']} validation tokens; each split needs one window of model.seq_len + 2 = "
                f"{min_tokens}: add text, raise data.max_bytes or lower model.seq_len"
            )
        names = [e["name"] for e in own]
        sources.append(
            {"name": source.name, "corpus": source.corpus, "files": files[source.name], **totals, "shards": names}
        )
    index = {
        "version": VERSION,
        "tokenizer": json.loads(next(iter(tokenizers))),
        "dtype": entries[0]["dtype"],
        **{f"{s}_tokens": sum(e[f"{s}_tokens"] for e in entries) for s in ("train", "val")},
        "skipped_lines": sum(e["skipped_lines"] for e in entries),
        "sources": sources,
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
    source: str
    """The name of the source (data.sources) whose files it holds."""
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
            Shard(path.parent / e["name"], e["source"], e["train_tokens"], e["val_tokens"], e["bytes"], e["crc32c"])
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
