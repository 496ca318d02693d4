"""trainflow.evaluate's torch-free half: task files read into typed items, every bad line, file or spec refused in one
line naming the value and the fix; exact match; the corpus task deterministic and read back by the task reader."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from trainflow.evaluate.corpus_task import write_corpus_task
from trainflow.evaluate.records import EvalRecord, ScoredChoice, ScoredGeneration, TaskScore
from trainflow.evaluate.tasks import Generation, MultipleChoice, TaskError, TaskKind, TaskSpec, exact_match, read_task
from trainflow.records import Record

GOOD = '{"context": "The sky is", "choices": [" blue", " green"], "gold": 0}'


def task_file(tmp_path: Path, *lines: str) -> Path:
    path = tmp_path / "task.jsonl"
    path.write_text("".join(line + "\n" for line in lines))
    return path


def refused(spec: TaskSpec) -> str:
    with pytest.raises(TaskError) as err:
        read_task(spec)
    message = str(err.value)
    assert "\n" not in message and message.strip() == message
    return message


def test_items_are_read_as_typed_records_up_to_the_limit(tmp_path):
    path = task_file(tmp_path, GOOD, "", GOOD.replace('"gold": 0', '"gold": 1'), GOOD)
    items = read_task(TaskSpec("sky", "choice", str(path), limit=2))
    assert items == [
        MultipleChoice("The sky is", [" blue", " green"], 0),
        MultipleChoice("The sky is", [" blue", " green"], 1),
    ]
    path = task_file(tmp_path, '{"question": "2+2=", "answer": "4"}')
    assert read_task(TaskSpec("sum", TaskKind.GENERATE, str(path))) == [Generation("2+2=", "4")]


@pytest.mark.parametrize(
    "line, named",
    [
        ("not json", "task.jsonl:2 is not JSON"),
        (
            "{'context': 'a', 'choices': ['b', 'c'], 'gold': 0}",
            "task.jsonl:2 is not JSON",
        ),  # a Python literal: never eval'd
        ('{"context": "a", "choices": ["b", "c"]}', "task.jsonl:2 lacks MultipleChoice's field 'gold'"),
        ('{"context": "a", "choices": ["b", "c"], "gold": 2}', "gold 2 is out of range for its 2 choices"),
        ('{"context": "a", "choices": ["b", "c"], "gold": -1}', "gold -1 is out of range"),
        ('{"context": "a", "choices": [], "gold": 0}', "task.jsonl:2: its choices are empty"),
        ('{"context": "a", "choices": ["b", ""], "gold": 0}', "its choice 1 is empty"),
        ('{"context": " ", "choices": ["b", "c"], "gold": 0}', "its context is empty"),
        ('{"context": "a", "choices": ["b", "c"], "gold": "1"}', "task.jsonl:2.gold holds '1', not a int"),
        ('{"context": "a", "choices": ["b", "c"], "gold": true}', "task.jsonl:2.gold holds True, not a int"),
        ('{"context": "a", "choices": "bc", "gold": 0}', "task.jsonl:2.choices holds str, not a list"),
        ('{"context": "a", "choices": ["b", 3], "gold": 0}', "task.jsonl:2.choices[1] holds 3, not a str"),
        ('{"context": 7, "choices": ["b", "c"], "gold": 0}', "task.jsonl:2.context holds 7, not a str"),
        (
            '{"context": "a", "choices": ["b", "c"], "gold": 0, "label": 0}',
            "holds 'label', which MultipleChoice has no",
        ),
        ('["a", ["b", "c"], 0]', "task.jsonl:2 holds list, not an object"),
        ('{"question": "2+2=", "answer": "4"}', "holds 'answer', which MultipleChoice has no field"),
    ],
)
def test_a_bad_line_is_refused_in_one_line_naming_its_place_and_value(tmp_path, line, named):
    message = refused(TaskSpec("t", "choice", str(task_file(tmp_path, GOOD, line))))
    assert named in message and message.endswith('as {"context": str, "choices": [str, ...], "gold": int}')


def test_a_bad_generation_line_names_its_field(tmp_path):
    path = task_file(tmp_path, '{"question": "2+2="}')
    assert "task.jsonl:1 lacks Generation's field 'answer'" in refused(TaskSpec("t", "generate", str(path)))


@pytest.mark.parametrize("kind", ["empty", "blank lines", "missing", "fifo", "folder", "symlink loop"])
def test_a_file_without_items_or_no_regular_file_is_refused_in_one_line(tmp_path, kind):
    path = tmp_path / "task.jsonl"
    if kind in ("empty", "blank lines"):
        path.write_text("" if kind == "empty" else "\n  \n")
    elif kind == "fifo":
        os.mkfifo(path)  # opened without waiting for a writer: the read would block for ever
    elif kind == "folder":
        path.mkdir()
    elif kind == "symlink loop":
        path.symlink_to(path)
    words = {"empty": "holds no items", "blank lines": "holds no items", "missing": "is missing", "fifo": "a FIFO"}
    words |= {"folder": "a folder", "symlink loop": "cannot be opened"}
    message = refused(TaskSpec("t", "choice", str(path)))
    assert str(path) in message and words[kind] in message


@pytest.mark.parametrize(
    "spec, named",
    [(dict(kind="mcq"), "kind 'mcq'; give one of choice, generate"), (dict(limit=-1), "limit -1")],
)
def test_a_bad_spec_is_refused_in_one_line(spec, named):
    with pytest.raises(TaskError, match=named):
        TaskSpec(**{"name": "t", "kind": "choice", "path": "t.jsonl", **spec})


def test_exact_match_strips_and_may_collapse_whitespace():
    assert exact_match(" 42 ", "42") and not exact_match("4 2", "42")
    assert not exact_match("a  b", "a b") and exact_match("a  b\t", " a b", collapse_whitespace=True)


def test_scores_aggregate_and_read_back():
    choices = [ScoredChoice([-1.0, -5.0], [1, 10], gold=1), ScoredChoice([-2.0, -1.0], [1, 1], gold=1)]
    score = TaskScore.of_choices("t", choices)
    assert (score.n, score.acc, score.acc_norm) == (2, 0.5, 1.0)  # -5/10 beats -1/1: the long choice wins normed
    generations = TaskScore.of_generations("g", [ScoredGeneration("4", "4", True), ScoredGeneration("5", "4", False)])
    assert (generations.acc, generations.acc_norm, generations.kind) == (0.5, None, TaskKind.GENERATE)
    record = EvalRecord("s", step=10, tokens=40960, tasks=[score, generations], seconds=1.5)
    assert EvalRecord.from_json(json.loads(json.dumps(record.to_json()))) == record
    assert isinstance(record, Record)


def corpus(tmp_path: Path, texts: list[str]) -> str:
    path = tmp_path / "corpus.jsonl"
    path.write_text("".join(json.dumps({"text": t}) + "\n" for t in texts))
    return str(path)


def test_the_corpus_task_is_deterministic_and_reads_back(tmp_path):
    words = ["apricots", "blankets", "crumpets", "doorways", "elephant", "fountain"]
    texts = [f"document number {i}: {word} and more" for i, word in enumerate(words)] + ["short"]
    glob = corpus(tmp_path, texts)
    args = dict(documents=10, context_chars=19, choice_chars=8, seed=3)
    items = write_corpus_task(glob, tmp_path / "a.jsonl", **args)
    write_corpus_task(glob, tmp_path / "b.jsonl", **args)
    assert (tmp_path / "a.jsonl").read_bytes() == (tmp_path / "b.jsonl").read_bytes()
    assert read_task(TaskSpec("corpus", "choice", str(tmp_path / "a.jsonl"))) == items
    assert len(items) == 6  # "short" holds fewer than 27 characters
    for text, item in zip(texts, items):
        assert item.context == text[:19] and item.choices[item.gold] == text[19:27] and len(set(item.choices)) == 4
    assert len({item.gold for item in items}) > 1  # shuffled, not always first
    assert [i.gold for i in write_corpus_task(glob, tmp_path / "c.jsonl", **{**args, "seed": 4})] != [
        i.gold for i in items
    ]


def test_a_corpus_too_small_for_four_choices_is_refused_in_one_line(tmp_path):
    glob = corpus(tmp_path, ["a long enough document number one", "a long enough document number two", "tiny"])
    with pytest.raises(TaskError, match=r"has 2 documents of at least 28 characters, fewer than the 4") as err:
        write_corpus_task(glob, tmp_path / "t.jsonl", context_chars=20, choice_chars=8)
    assert "\n" not in str(err.value) and not (tmp_path / "t.jsonl").exists()
