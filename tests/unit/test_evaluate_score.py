"""trainflow.evaluate.score against transformers: a tiny random Llama written as a Hugging Face folder by the
project's writer (hf.write, hf.llama's names and config.json), its multiple-choice log-likelihoods computed by our
scorer on our model, on the model imported back from the folder (io.init_from's load_hf) and by hand through
transformers' LlamaForCausalLM (logits -> log_softmax -> gather, one choice at a time, unpadded) agree within 1e-4;
greedy generation equals transformers' generate token for token, and exact match counts it."""

from __future__ import annotations

import dataclasses
import json

import pytest
import torch
import transformers

from tests.conftest import REPO
from trainflow.checkpoint.hf_reader import load_hf
from trainflow.config import ModelConfig, compose
from trainflow.data.tokenizer import ByteTokenizer, HfTokenizer, train_bpe
from trainflow.evaluate import score
from trainflow.evaluate.score import (
    generate,
    greedy_tokens,
    prompt_ids,
    requests,
    score_choices,
    score_generations,
    score_task,
)
from trainflow.evaluate.tasks import Generation, MultipleChoice, TaskError, TaskSpec, write_task
from trainflow.hf.llama import folder_shapes, hf_config, hf_name
from trainflow.hf.write import plan_shards, write_folder
from trainflow.model import Llama

TOLERANCE = 1e-4  # max abs log-likelihood difference, fp32
# Weights far from zero (init_std 0.3): peaked logits, so a wrong position or token would show and argmaxes don't tie.
TINY = ["model.n_layers=2", "model.dim=64", "model.seq_len=48", "model.init_std=0.3"]
ITEMS = [
    MultipleChoice("def quote(s):\n    return ", ["s", "repr(s)", " '\"' + s"], 1),  # trailing spaces move to choices
    MultipleChoice("The quick brown", [" fox", " dog jumps", "fox"], 0),  # " fox" merges across a boundary
    MultipleChoice("x" * 60 + " = textwrap.", ["dedent(text)", "fill(text, width=70)"], 0),  # past seq_len: cut left
]


@dataclasses.dataclass
class Models:
    m: ModelConfig
    tokenizer: HfTokenizer
    ours: Llama
    imported: Llama
    theirs: transformers.LlamaForCausalLM


@pytest.fixture(scope="module")
def models(tmp_path_factory) -> Models:
    """A BPE of the test corpus, a random tiny Llama of its vocabulary, its Hugging Face folder and both readings."""
    folder = tmp_path_factory.mktemp("eval") / "hf"
    tokenizer = train_bpe([p.read_text() for p in sorted((REPO / "tests/assets/corpus").glob("*.txt"))], 320)
    m = dataclasses.replace(compose("train_segment", TINY).model, vocab_size=tokenizer.vocab_size)
    torch.manual_seed(0)
    ours = Llama(m).eval()
    weights = ours.state_dict()
    config = json.dumps(hf_config(m, tokenizer.eot_id))
    write_folder(
        folder,
        {"config.json": config},
        plan_shards(folder_shapes(m), 1 << 30),
        lambda names: {hf_name(k): weights[k].contiguous() for k in names},
    )
    imported = Llama(m)
    load_hf(folder, [imported], m)
    theirs = transformers.LlamaForCausalLM.from_pretrained(folder, dtype=torch.float32).eval()
    return Models(m, tokenizer, ours, imported.eval(), theirs)


def encode(tokenizer: HfTokenizer, text: str) -> list[int]:
    return tokenizer.encode_batch([text])[0].tolist()


@torch.no_grad()
def transformers_loglikelihoods(models: Models, item: MultipleChoice) -> list[float]:
    """lm-eval's recipe through transformers: context (its trailing whitespace moved to the choice) and choice encoded
    apart, concatenated, the last seq_len + 1 tokens kept; the choice's tokens' log-probabilities summed."""
    context = item.context.rstrip()
    out = []
    for choice in item.choices:
        ctx, cont = encode(models.tokenizer, context), encode(models.tokenizer, item.context[len(context) :] + choice)
        whole = (ctx + cont)[-(models.m.seq_len + 1) :]
        logprobs = models.theirs(torch.tensor([whole[:-1]])).logits[0].float().log_softmax(-1)  # (T, vocab)
        start = len(whole) - 1 - len(cont)
        out.append(sum(logprobs[start + j, token].item() for j, token in enumerate(cont)))
    return out


def test_choice_loglikelihoods_agree_with_transformers(models):
    merged = encode(models.tokenizer, "The quick brown fox")
    assert merged != encode(models.tokenizer, "The quick brown") + encode(models.tokenizer, "fox")  # a merge to avoid
    expected = [transformers_loglikelihoods(models, item) for item in ITEMS]
    assert len(encode(models.tokenizer, ITEMS[2].context)) > models.m.seq_len  # the left cut is exercised
    for model in (models.ours, models.imported):
        scored = score_choices(model, models.tokenizer, ITEMS, batch_rows=3)  # rows of different items, padded
        diff = max(abs(a - b) for s, e in zip(scored, expected) for a, b in zip(s.loglikelihoods, e))
        assert diff <= TOLERANCE, diff
        assert [s.lengths for s in scored] == [[len(c) for c in item.choices] for item in ITEMS]
    assert min(min(e) for e in expected) < -5  # far from zero: the sums mean something


def test_greedy_generation_equals_transformers_generate(models):
    for prompt in ("def f(x):\n    ", "import string\n"):
        ids = encode(models.tokenizer, prompt)
        ours = list(greedy_tokens(models.ours, ids, max_new_tokens=12, eot_id=models.tokenizer.eot_id))
        with torch.no_grad():
            theirs = models.theirs.generate(
                torch.tensor([ids]),
                attention_mask=torch.ones(1, len(ids), dtype=torch.long),
                do_sample=False,
                max_new_tokens=12,
                eos_token_id=models.tokenizer.eot_id,
                pad_token_id=models.tokenizer.eot_id,
            )[0, len(ids) :].tolist()
        assert ours == [t for t in theirs if t != models.tokenizer.eot_id] and ours


def test_exact_match_counts_generations_cut_at_the_stop_string(models, tmp_path):
    prompt = "def f(x):\n    "
    whole = generate(models.ours, models.tokenizer, prompt, max_new_tokens=12, stop="")
    assert len(whole) > 2 and whole == models.tokenizer.decode(
        list(
            greedy_tokens(
                models.ours, prompt_ids(models.tokenizer, prompt), max_new_tokens=12, eot_id=models.tokenizer.eot_id
            )
        )
    )
    stop = whole[2]
    cut = whole[: whole.index(stop)]
    items = [Generation(prompt, f" {cut}\t"), Generation(prompt, "not this")]
    scored = score_generations(models.ours, models.tokenizer, items, max_new_tokens=12, stop=stop)
    assert [s.generated for s in scored] == [cut, cut] and [s.correct for s in scored] == [True, False]
    write_task(tmp_path / "gen.jsonl", items)
    score = score_task(
        models.ours,
        models.tokenizer,
        TaskSpec("gen", "generate", str(tmp_path / "gen.jsonl"), stop=stop),
        max_new_tokens=12,
    )
    assert (score.n, score.acc, score.acc_norm) == (2, 0.5, None)


def test_a_task_scores_acc_and_acc_norm(models, tmp_path):
    write_task(tmp_path / "mc.jsonl", ITEMS)
    scored = score_choices(models.ours, models.tokenizer, ITEMS)
    score = score_task(models.ours, models.tokenizer, TaskSpec("mc", "choice", str(tmp_path / "mc.jsonl")))
    assert score.n == 3 and score.acc == sum(s.predicted == s.gold for s in scored) / 3
    assert score.acc_norm == sum(s.predicted_norm == s.gold for s in scored) / 3


def test_a_choice_longer_than_the_sequence_is_refused_in_one_line(models):
    m = dataclasses.replace(models.m, vocab_size=ByteTokenizer().vocab_size)
    item = MultipleChoice("context", ["y" * (m.seq_len + 1), "n"], 1)
    with pytest.raises(
        TaskError, match=rf"item 0 has a choice of {m.seq_len + 1} tokens, more than the model's seq_len\({m.seq_len}\)"
    ):
        score_choices(Llama(m), ByteTokenizer(), [item])


def test_a_begin_of_text_token_starts_each_context_as_it_starts_each_document(monkeypatch):
    pairs = requests(ByteTokenizer(bos_id=255), MultipleChoice("ab ", ["c", "d"], 0))
    assert pairs == [([255, 97, 98], [32, 99]), ([255, 97, 98], [32, 100])]  # the space moved to the choices
    prompts = []  # and each generation's prompt (it read none before: contexts had it, prompts did not)
    monkeypatch.setattr(score, "greedy_tokens", lambda model, ids, **kw: prompts.append(ids) or iter(()))
    assert score.generate(None, ByteTokenizer(bos_id=255), "ab", max_new_tokens=4, stop="") == ""
    assert prompts == [[255, 97, 98]]
