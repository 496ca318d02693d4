"""A multiple-choice task made from the run's own corpus, for the smoke run (no downloaded benchmark there): which of
four continuations follows a document's opening.

    python -c "from trainflow.evaluate.corpus_task import write_corpus_task; \
        print(len(write_corpus_task('<stdlib>/json/*.py', '/tmp/corpus_task.jsonl', documents=8)))"

Item i is document i's first `context_chars` characters; its choices are the next `choice_chars` characters of that
document and of the next three documents in corpus order (cyclically) at the same offset, whose continuations differ
from it and from each other; the four are shuffled by a random.Random(seed), gold the true one's place. The documents
are the first `documents` of the corpus (data.documents' order and formats) long enough for both parts. A model that
learnt the corpus scores well above chance (0.25); one that did not scores about 0.25. The same corpus and settings
give the same file.
"""

from __future__ import annotations

import logging
import random
from pathlib import Path

from trainflow.data.corpus import corpus_files
from trainflow.data.documents import Documents
from trainflow.evaluate.tasks import MultipleChoice, TaskError, TooFewDocuments, write_task

log = logging.getLogger(__name__)
CHOICES = 4


def corpus_texts(corpus: str, *, documents: int, length: int, text_field: str = "text") -> list[str]:
    """The first `documents` texts of the corpus (a glob, as data.corpus) that hold at least `length` characters."""
    texts = []
    for doc in Documents(corpus_files(corpus), text_field=text_field):
        if len(doc.text) >= length:
            texts.append(doc.text)
            if len(texts) == documents:
                break
    return texts


def corpus_items(texts: list[str], *, context_chars: int, choice_chars: int, seed: int) -> list[MultipleChoice]:
    """One item per text (see the module's docstring); one TaskError where a text has no three others whose
    continuations differ from its own."""
    cut = slice(context_chars, context_chars + choice_chars)
    rng = random.Random(seed)
    items = []
    for i, text in enumerate(texts):
        choices = [text[cut]]
        for other in texts[i + 1 :] + texts[:i]:
            if len(choices) < CHOICES and other[cut] not in choices:
                choices.append(other[cut])
        if len(choices) < CHOICES:
            raise TaskError(
                f"document {i} of the corpus task has {len(choices) - 1} others with another continuation at "
                f"character {context_chars}, not {CHOICES - 1}; give more documents (or other ones)"
            )
        order = list(range(CHOICES))
        rng.shuffle(order)
        items.append(MultipleChoice(text[:context_chars], [choices[k] for k in order], order.index(0)))
    return items


def write_corpus_task(
    corpus: str,
    out: str | Path,
    *,
    documents: int = 16,
    context_chars: int = 64,
    choice_chars: int = 16,
    seed: int = 0,
    text_field: str = "text",
) -> list[MultipleChoice]:
    """The corpus task of the corpus (a glob, as data.corpus) written to `out` atomically (tasks.write_task); its
    items. One TaskError where fewer than four documents are long enough."""
    if context_chars < 1 or choice_chars < 1:
        raise TaskError(
            f"context_chars({context_chars}) and choice_chars({choice_chars}) must be at least 1; give lengths > 0"
        )
    texts = corpus_texts(corpus, documents=documents, length=context_chars + choice_chars, text_field=text_field)
    if len(texts) < CHOICES:
        raise TooFewDocuments(
            f"{corpus!r} has {len(texts)} documents of at least {context_chars + choice_chars} characters, fewer than "
            f"the {CHOICES} an item's choices come from; give a corpus with more, or lower context_chars/choice_chars"
        )
    items = corpus_items(texts, context_chars=context_chars, choice_chars=choice_chars, seed=seed)
    write_task(out, items)
    log.info("Wrote %d corpus items (%d choices each) to %s", len(items), CHOICES, out)
    return items
