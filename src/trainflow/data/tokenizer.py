"""Tokenizers: bytes, a byte-level BPE trained on a sample of the corpus, or a pretrained tokenizer.json.

    python -c "from trainflow.data.tokenizer import load_pretrained as p; print(p('tokenizer.json').vocab_size)"

Every tokenizer gives `vocab_size`, `eot_id` (appended to every document), `bos_id` (prepended, or None),
`encode_batch`, `decode` (an evaluation's generated text) and `to_json` (the text stored with the tokens, whose SHA-256
is the tokenizer's hash).
Token ids are stored as uint16 when the vocabulary fits, uint32 otherwise (Megatron's rule).
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from tokenizers import Tokenizer

from trainflow.config import BYTE_VOCAB
from trainflow.data.record import DataError

EOT_TEXT = "<|endoftext|>"
# The end- and begin-of-text tokens of the common tokenizer.json files, in the order they are looked for
# (tokenizer.json does not say which token ends a document; tokenizer_config.json does, and is not read).
EOS_NAMES = ("<|end_of_text|>", EOT_TEXT, "</s>", "<eos>", "<|eos|>")
BOS_NAMES = ("<|begin_of_text|>", "<s>", "<bos>", "<|bos|>")


def token_dtype(vocab_size: int) -> np.dtype:
    return np.dtype(np.uint16 if vocab_size <= 1 << 16 else np.uint32)


@dataclass
class ByteTokenizer:
    """UTF-8 bytes as tokens 0..255 and 256 as end of document: nothing to train, nothing unknown."""

    kind: str = "byte"
    vocab_size: int = BYTE_VOCAB
    eot_id: int = 256
    bos_id: int | None = None

    def encode_batch(self, texts: list[str]) -> list[np.ndarray]:
        return [np.frombuffer(t.encode("utf-8"), dtype=np.uint8) for t in texts]

    def decode(self, ids: list[int]) -> str:
        """The text of `ids`, the end-of-document token dropped and a UTF-8 sequence cut short replaced."""
        return bytes(i for i in ids if i < 256).decode("utf-8", errors="replace")

    def to_json(self) -> str:
        return json.dumps({"type": "byte", "vocab_size": self.vocab_size})


class HfTokenizer:
    """A HuggingFace `tokenizers` tokenizer: a BPE trained here (kind `bpe`) or a pretrained file."""

    def __init__(self, tok: Tokenizer, *, kind: str, eot_id: int, bos_id: int | None) -> None:
        self.tok, self.kind, self.eot_id, self.bos_id = tok, kind, eot_id, bos_id
        self.vocab_size = tok.get_vocab_size(with_added_tokens=True)

    def encode_batch(self, texts: list[str]) -> list[np.ndarray]:
        # Special tokens are added here (eot_id, bos_id), not by the file's post-processor.
        return [np.asarray(e.ids) for e in self.tok.encode_batch(texts, add_special_tokens=False)]

    def decode(self, ids: list[int]) -> str:
        return self.tok.decode(ids, skip_special_tokens=True)

    def to_json(self) -> str:
        return self.tok.to_str()


def train_bpe(texts: Iterable[str], vocab_size: int) -> HfTokenizer:
    """A byte-level BPE of `vocab_size` tokens (EOT_TEXT among them) trained on `texts`."""
    from tokenizers import ByteLevelBPETokenizer

    trainer = ByteLevelBPETokenizer()
    trainer.train_from_iterator(texts, vocab_size=vocab_size, special_tokens=[EOT_TEXT], show_progress=False)
    tok = trainer._tokenizer  # the plain Tokenizer under the convenience wrapper, as load_tokenizer reads it
    return HfTokenizer(tok, kind="bpe", eot_id=tok.token_to_id(EOT_TEXT), bos_id=None)


def parse_tokenizer(text: str, *, kind: str, origin: str) -> HfTokenizer:
    """A tokenizer.json's text as a tokenizer; one DataError naming `origin` if it does not parse or names no
    end-of-text token."""
    try:
        tok = Tokenizer.from_str(text)
    except Exception as err:  # tokenizers raises plain Exceptions
        reason = str(err).replace("\n", " ")
        raise DataError(
            f"{origin} does not parse as a HuggingFace tokenizer.json ({reason}); give a valid file"
        ) from err
    found = {name: i for name in EOS_NAMES + BOS_NAMES if (i := tok.token_to_id(name)) is not None}
    eos = next((found[n] for n in EOS_NAMES if n in found), None)
    if eos is None:
        raise DataError(f"{origin} has none of the end-of-text tokens {', '.join(EOS_NAMES)}; add one to the file")
    return HfTokenizer(tok, kind=kind, eot_id=eos, bos_id=next((found[n] for n in BOS_NAMES if n in found), None))


def load_pretrained(path: str) -> HfTokenizer:
    try:
        text = Path(path).read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as err:
        raise DataError(f"data.tokenizer_path({path!r}) cannot be read ({err}); give a tokenizer.json file") from err
    return parse_tokenizer(text, kind="pretrained", origin=f"data.tokenizer_path({path!r})")


def load_tokenizer(kind: str, text: str, *, origin: str) -> ByteTokenizer | HfTokenizer:
    """The tokenizer `to_json` wrote (a trained BPE read back by every shard job)."""
    return ByteTokenizer() if kind == "byte" else parse_tokenizer(text, kind=kind, origin=origin)


def tokenizer_hash(tokenizer: ByteTokenizer | HfTokenizer) -> str:
    return hashlib.sha256(tokenizer.to_json().encode()).hexdigest()
