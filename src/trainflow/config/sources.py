"""A weighted mixture of corpora (data.sources): each source's settings, the one-source mixture a plain data.corpus
is, and the rules a mixture must keep.

    python -c "from trainflow.config import compose; from trainflow.config.sources import sources_of; \
        print(sources_of(compose('prepare_data', ['data=stdlib_mix']).data))"

    data.sources='[{name:web,corpus:/data/web/*.jsonl.zst,weight:0.7},{name:code,corpus:/data/code/*.parquet,weight:0.3}]'

Everything but the files and the text field is shared by the sources (data.tokenizer, vocab_size, val_fraction,
bad_lines, max_bytes per source, chunk_tokens): one tokenizer reads every source, so their tokens mix. A source's
weight is how much of each training batch it gives (data.mixture); it is no part of what tokenising reads, so a new
mixture of the same corpora draws from the same shards (config.hashing leaves the weights out of prepare_data's
hash). A weight of 0 keeps a source for evaluation only.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

from omegaconf import MISSING

from trainflow.config.domain import RUN_NAME, checked

DEFAULT_SOURCE = "corpus"
"""The name of the one source a plain data.corpus is."""


@dataclass
class SourceConfig:
    name: str = checked(pattern=RUN_NAME, fix="letters, digits, _ . - and no leading dot")
    """How reports, TensorBoard and the token index name the source."""
    corpus: str = MISSING
    """Glob of its input files, as data.corpus."""
    weight: float = checked(1.0, ge=0)
    """Its share of the training batches, relative to the other sources' weights (0: evaluated only)."""
    text_field: str = "text"
    """The field of its JSONL objects or Parquet column that holds the text."""
    shards: int = checked(1, ge=1)
    """Groups of its input files, each tokenised by its own job."""


class Mixture(Protocol):
    """What the functions below read of a DataConfig (config.schema's, which holds SourceConfigs: it imports this
    module, so this one names the fields it reads instead of importing it)."""

    sources: list[SourceConfig]
    corpus: str
    text_field: str
    shards: int


def sources_of(d: Mixture) -> list[SourceConfig]:
    """The mixture a data config trains on: data.sources, or data.corpus as the one source of weight 1."""
    if d.sources:
        return list(d.sources)
    return [SourceConfig(name=DEFAULT_SOURCE, corpus=d.corpus, weight=1.0, text_field=d.text_field, shards=d.shards)]


def source_key(d: Mixture, i: int, field: str) -> str:
    """How errors name a source's setting: data.sources[i].corpus, or data.corpus for a plain corpus."""
    return f"data.sources[{i}].{field}" if d.sources else f"data.{field}"


def source_errors(d: Mixture) -> list[str]:
    """Names unique, and weights that add up to a positive share to draw."""
    names = [s.name for s in d.sources]
    errors = [
        f"data.sources names {name!r} twice; give each source its own name"
        for name in sorted(set(names))
        if names.count(name) > 1
    ]
    if d.sources and not sum(s.weight for s in d.sources) > 0:
        weights = ", ".join(f"{s.name} {s.weight:g}" for s in d.sources)
        errors.append(f"data.sources' weights ({weights}) add up to no positive share; give at least one a weight > 0")
    return errors
