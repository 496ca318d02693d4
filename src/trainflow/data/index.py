"""The index of a corpus's token shards (index.json, a TokenIndex): what training and staging read to find, check
and size them.

    python -c "from trainflow.data.index import read_index; print(read_index('index.json', rerun='x').sources)"

index.json lies beside its shards, keyed by TokenIndex's fields (and those of its TokenizerFacts, SourceEntry and
ShardEntry records). Each source of a mixture (data.sources; a plain data.corpus is the one source `corpus`) has its
own shards, listed in its entry; all of them share one tokenizer, or the index is refused. The weights are not here:
they are how training draws (data.mixture), not what was tokenised.

The shards' bytes and CRC-32C come from their records (data.record), written when each shard was; the index has
its own record too (index.json.crc.json), which the sampler checks on open. An index that is not a TokenIndex (another
version's, an altered one) is refused in one line naming the file and the field.
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
from trainflow.records import Record, RecordError
from trainflow.records import read_record as read_document

VERSION = 2
RERUN = "prepare_data (snakemake --forcerun prepare_data)"


@dataclass(frozen=True)
class Shard:
    """A shard of the index as a file (TokenIndex.shard_files)."""

    path: Path
    source: str
    """The name of the source (data.sources) whose files it holds."""
    train_tokens: int
    val_tokens: int
    bytes: int
    crc32c: int


@dataclass(frozen=True)
class TokenizerFacts(Record):
    """The tokenizer every shard was made with (data.tokenizer)."""

    kind: str
    """byte or bpe."""
    sha256: str
    """Of the tokenizer's JSON (bpe; '' for the byte tokenizer)."""
    vocab_size: int
    eot_id: int
    bos_id: int


@dataclass(frozen=True)
class ShardEntry(Record):
    """One shard of the index, from its attributes and its record (data.record)."""

    name: str
    """Its file name, beside the index."""
    source: str
    """The name of the source (data.sources) whose files it holds."""
    train_tokens: int
    val_tokens: int
    train_documents: int
    val_documents: int
    dtype: str
    skipped_lines: int
    bytes: int
    crc32c: int
    sources: list[str]
    """Its input files, each '<file>\\t<documents>'."""


@dataclass(frozen=True)
class SourceEntry(Record):
    """One source of the corpus (data.sources): its files and the shards made from them."""

    name: str
    corpus: str
    """Its glob."""
    files: int
    train_tokens: int
    val_tokens: int
    shards: list[str]
    """Its shards' names, in the order their splits are concatenated."""


@dataclass(frozen=True)
class TokenIndex(Record):
    version: int
    tokenizer: TokenizerFacts
    dtype: str
    train_tokens: int
    val_tokens: int
    skipped_lines: int
    sources: list[SourceEntry]
    shards: list[ShardEntry]

    def __post_init__(self) -> None:
        if self.version != VERSION:
            raise DataError(f"version {self.version}, not {VERSION}")

    def shard_files(self, folder: Path) -> list[Shard]:
        """The shards as files in `folder` (the index's own, or where it is staged)."""
        return [Shard(folder / e.name, e.source, e.train_tokens, e.val_tokens, e.bytes, e.crc32c) for e in self.shards]


def shard_recipe(data: DataConfig, source: SourceConfig, files: list[str]) -> str:
    """A hash of what a shard is made from (the shared data settings, its source's but the weight, its files): a
    shard that records another recipe is stale."""
    shared = {k: v for k, v in as_dict(data).items() if k != "sources"}
    own = {k: v for k, v in as_dict(source).items() if k != "weight"}
    blob = json.dumps({"data": shared, "source": own, "files": files}, sort_keys=True)
    return hashlib.sha256(blob.encode()).hexdigest()


def shard_entry(path: Path) -> tuple[ShardEntry, TokenizerFacts]:
    """One shard's entry of the index, from its attributes and its record, and the tokenizer it was made with."""
    size, crc = read_record(path, rerun=RERUN)
    try:
        with h5py.File(path, "r") as f:
            a = f.attrs
            counts = {k: int(a[k]) for k in ("train_tokens", "val_tokens", "train_documents", "val_documents")}
            tokenizer = TokenizerFacts(
                kind=str(a["tokenizer"]),
                sha256=str(a["tokenizer_sha256"]),
                **{k: int(a[k]) for k in ("vocab_size", "eot_id", "bos_id")},
            )
            sources = [s.decode() if isinstance(s, bytes) else s for s in f["sources"][:]]
            entry = ShardEntry(
                name=path.name,
                source=str(a["source"]),
                dtype=str(a["dtype"]),
                skipped_lines=int(a["skipped_lines"]),
                bytes=size,
                crc32c=crc,
                sources=sources,
                **counts,
            )
    except (OSError, KeyError) as err:
        raise DataError(f"{path} is no token shard or lacks its attributes ({err}); rerun {RERUN}") from err
    return entry, tokenizer


def write_index(
    out: Path, shards: list[Path], *, data: DataConfig, files: dict[str, int], min_tokens: int
) -> TokenIndex:
    """Gather the shards' entries into `out`; `files` counts each source's input files. Every source's split must
    hold `min_tokens` (one training window), and every shard must come from the one tokenizer."""
    made = [shard_entry(p) for p in shards]
    entries = [e for e, _ in made]
    tokenizers = {t: e for e, t in made}
    if len(tokenizers) != 1:
        (one, a), (other, b) = list(tokenizers.items())[:2]
        raise DataError(
            f"{a.name} (source {a.source}) and {b.name} (source {b.source}) beside {out} were made by "
            f"different tokenizers ({one.kind} {one.sha256[:12]}, {other.kind} {other.sha256[:12]}); the sources of "
            f"a mixture share one: rerun {RERUN}"
        )
    sources = []
    for i, source in enumerate(sources_of(data)):
        own = [e for e in entries if e.source == source.name]
        train, val = sum(e.train_tokens for e in own), sum(e.val_tokens for e in own)
        if min(train, val) < min_tokens:
            raise DataError(
                f"{source_key(data, i, 'corpus')}({source.corpus!r}) gave {train} training and {val} validation "
                f"tokens; each split needs one window of model.seq_len + 2 = {min_tokens}: add text, raise "
                "data.max_bytes or lower model.seq_len"
            )
        sources.append(SourceEntry(source.name, source.corpus, files[source.name], train, val, [e.name for e in own]))
    index = TokenIndex(
        version=VERSION,
        tokenizer=next(iter(tokenizers)),
        dtype=entries[0].dtype,
        train_tokens=sum(e.train_tokens for e in entries),
        val_tokens=sum(e.val_tokens for e in entries),
        skipped_lines=sum(e.skipped_lines for e in entries),
        sources=sources,
        shards=entries,
    )
    write_index_file(out, index)
    return index


def write_index_file(out: Path, index: TokenIndex) -> None:
    """Write an index atomically with its size and CRC-32C beside it (data.record), as every token file has."""
    with recorded(out) as tmp:
        tmp.write_text(json.dumps(index.to_json(), indent=1, sort_keys=True) + "\n")


def read_index(path: str | Path, *, rerun: str) -> TokenIndex:
    """The index in `path`; missing, unreadable or not a TokenIndex, one DataError saying to rerun `rerun`."""
    try:
        return read_document(TokenIndex, path, rerun=rerun)
    except RecordError as err:
        raise DataError(f"the index of the token shards: {err}") from None


def first_shard(index: str | Path) -> Path:
    """The first shard beside an index (where the tokenizer's JSON is recorded, data.tokens)."""
    return Path(index).parent / shard_name(0)
