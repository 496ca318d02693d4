"""Scoring a single-process model on downstream tasks: multiple choice by log-likelihood, generation by greedy
decoding and exact match, as lm-evaluation-harness computes them.

    python -c "from trainflow.config import compose; from trainflow.model import Llama; \
        from trainflow.data.tokenizer import ByteTokenizer; from trainflow.evaluate.score import score_task; \
        from trainflow.evaluate.corpus_task import write_corpus_task; from trainflow.evaluate.tasks import TaskSpec; \
        write_corpus_task('<stdlib>/json/*.py', '/tmp/json.jsonl', documents=8); \
        m = compose('train_segment').model; \
        print(score_task(Llama(m), ByteTokenizer(), TaskSpec('json', 'choice', '/tmp/json.jsonl')))"

Log-likelihood (lm-eval's `loglikelihood`): the context and the choice are tokenised separately and concatenated, so
the choice's tokens are exactly its own even where the tokenizer would merge across the boundary (a BPE's one token
for "brownfox" of the context "The quick brown" and the choice "fox"); whitespace ending the context moves to the
choice first, as lm-eval moves it. A tokenizer with a begin-of-text token starts every context and prompt with it, as
prepare_data starts every document. The concatenation keeps its last seq_len + 1 tokens (truncated from the left)
and the model reads all but the last; a choice's log-likelihood is the sum of log_softmax (fp32) over its tokens.
Rows, one per choice, are batched across items in the order given (lm-eval sorts them by length to pad less: not
needed at these sizes).

Everything runs in eval mode under torch.no_grad, on the device the model's parameters are on.
"""

from __future__ import annotations

from collections.abc import Iterator

import torch
import torch.nn.functional as F

from trainflow.data.tokenizer import ByteTokenizer, HfTokenizer
from trainflow.evaluate.records import ScoredChoice, ScoredGeneration, TaskScore
from trainflow.evaluate.tasks import Generation, MultipleChoice, TaskError, TaskKind, TaskSpec, exact_match, read_task
from trainflow.model import Llama

Tokenizer = ByteTokenizer | HfTokenizer
MAX_NEW_TOKENS = 32
BATCH_ROWS = 32
"""Choices scored in one forward pass."""


def score_task(
    model: Llama, tokenizer: Tokenizer, spec: TaskSpec, *, max_new_tokens: int = MAX_NEW_TOKENS
) -> TaskScore:
    """The task's score: its items read (tasks.read_task) and scored by its kind."""
    items = read_task(spec)
    if spec.kind is TaskKind.CHOICE:
        return TaskScore.of_choices(spec.name, score_choices(model, tokenizer, items))
    scored = score_generations(model, tokenizer, items, max_new_tokens=max_new_tokens, stop=spec.stop)
    return TaskScore.of_generations(spec.name, scored)


def encode(tokenizer: Tokenizer, text: str) -> list[int]:
    return [int(i) for i in tokenizer.encode_batch([text])[0]]


def prompt_ids(tokenizer: Tokenizer, text: str) -> list[int]:
    """The tokens of a context or prompt: the begin-of-text token first where the tokenizer has one."""
    return ([] if tokenizer.bos_id is None else [tokenizer.bos_id]) + encode(tokenizer, text)


def requests(tokenizer: Tokenizer, item: MultipleChoice) -> list[tuple[list[int], list[int]]]:
    """Each choice's (context tokens, choice tokens)."""
    return [pair_ids(tokenizer, item.context, choice) for choice in item.choices]


def pair_ids(tokenizer: Tokenizer, context: str, continuation: str) -> tuple[list[int], list[int]]:
    """A continuation's (context tokens, continuation tokens), tokenised apart, the context's trailing whitespace moved
    to the continuation (lm-eval's `_encode_pair`); an empty context is the end-of-document token alone where the
    tokenizer has no begin-of-text token (lm-eval's prefix token), so the first token is predicted from something."""
    kept = context.rstrip()
    return prompt_ids(tokenizer, kept) or [tokenizer.eot_id], encode(tokenizer, context[len(kept) :] + continuation)


def score_choices(
    model: Llama, tokenizer: Tokenizer, items: list[MultipleChoice], *, batch_rows: int = BATCH_ROWS
) -> list[ScoredChoice]:
    """Each item's choices' log-likelihoods given its context; one TaskError where a choice alone is longer than the
    model's sequence."""
    rows = [(i, pair) for i, item in enumerate(items) for pair in requests(tokenizer, item)]
    if long := next(((i, len(c)) for i, (_, c) in rows if len(c) > window(model)), None):
        raise TaskError(
            f"item {long[0]} has a choice of {long[1]} tokens, more than the model's seq_len({window(model)}); "
            "shorten it"
        )
    sums: list[list[float]] = [[] for _ in items]
    for (i, _), (ll, _) in zip(rows, batched_loglikelihoods(model, [pair for _, pair in rows], batch_rows=batch_rows)):
        sums[i].append(ll)
    return [ScoredChoice(s, [len(c) for c in item.choices], item.gold) for s, item in zip(sums, items)]


def window(model: Llama) -> int:
    """The model's window: its rotary table's rows (model.seq_len)."""
    return model.rope_cos.shape[0]


def batched_loglikelihoods(
    model: Llama, pairs: list[tuple[list[int], list[int]]], *, batch_rows: int = BATCH_ROWS
) -> list[tuple[float, bool]]:
    """loglikelihoods of every pair, `batch_rows` a forward pass (rows of different items padded together)."""
    out: list[tuple[float, bool]] = []
    for start in range(0, len(pairs), batch_rows):
        out += loglikelihoods(model, pairs[start : start + batch_rows], window(model))
    return out


@torch.no_grad()
def loglikelihoods(model: Llama, pairs: list[tuple[list[int], list[int]]], seq_len: int) -> list[tuple[float, bool]]:
    """Each continuation's summed log-probability given its context, and whether greedy decoding would produce it
    (every one of its tokens the argmax: lm-eval's `is_greedy`), one forward pass for all."""
    model.eval()
    device = next(model.parameters()).device
    wholes = [(ctx + cont)[-(seq_len + 1) :] for ctx, cont in pairs]
    width = max(len(w) for w in wholes) - 1
    ids = torch.zeros(len(pairs), width, dtype=torch.long)  # right-padded: causal attention never reads the padding
    for row, whole in enumerate(wholes):
        ids[row, : len(whole) - 1] = torch.tensor(whole[:-1])
    logprobs = F.log_softmax(model(ids.to(device)).float(), dim=-1)  # (B, T, vocab)
    out = []
    for row, ((_, cont), whole) in enumerate(zip(pairs, wholes)):
        end = len(whole) - 1  # the input's length; its last len(cont) positions predict the continuation
        span, targets = logprobs[row, end - len(cont) : end], torch.tensor(cont, device=device)
        ll = span.gather(-1, targets.unsqueeze(-1)).sum().item()
        out.append((ll, bool((span.argmax(-1) == targets).all())))
    return out


@torch.no_grad()
def greedy_tokens(model: Llama, ids: list[int], *, max_new_tokens: int, eot_id: int) -> Iterator[int]:
    """Up to `max_new_tokens` tokens continuing `ids`, each the argmax of the logits, until the end-of-document token
    (not yielded); one at a time, so a caller stops it at a stop string. Every step reruns the whole window: no KV
    cache, which the tiny models evaluated here do not need (the window is the last seq_len tokens)."""
    model.eval()
    device, seq_len = next(model.parameters()).device, window(model)
    out: list[int] = []
    while len(out) < max_new_tokens:
        last = torch.tensor([(ids + out)[-seq_len:]], device=device)  # (1, T)
        token = int(model(last)[0, -1].float().argmax())
        if token == eot_id:
            return
        out.append(token)
        yield token


def generate(
    model: Llama, tokenizer: Tokenizer, prompt: str, *, max_new_tokens: int, stop: str | tuple[str, ...]
) -> str:
    """The greedy continuation of `prompt` as text, cut before the first occurrence of a stop string ("" or () cuts
    nowhere)."""
    stops = tuple(s for s in ((stop,) if isinstance(stop, str) else stop) if s)
    out: list[int] = []
    for token in greedy_tokens(
        model, prompt_ids(tokenizer, prompt), max_new_tokens=max_new_tokens, eot_id=tokenizer.eot_id
    ):
        out.append(token)
        text = tokenizer.decode(out)
        if cuts := [text.index(s) for s in stops if s in text]:
            return text[: min(cuts)]
    return tokenizer.decode(out)


def score_generations(
    model: Llama,
    tokenizer: Tokenizer,
    items: list[Generation],
    *,
    max_new_tokens: int = MAX_NEW_TOKENS,
    stop: str = "\n",
    collapse_whitespace: bool = False,
) -> list[ScoredGeneration]:
    """Each item's greedy generation, cut at `stop`, and whether it matches the answer (tasks.exact_match)."""
    scored = []
    for item in items:
        text = generate(model, tokenizer, item.question, max_new_tokens=max_new_tokens, stop=stop)
        scored.append(
            ScoredGeneration(text, item.answer, exact_match(text, item.answer, collapse_whitespace=collapse_whitespace))
        )
    return scored
