"""Downstream tasks read from JSONL files on local disk, without torch: their items as typed records, every bad line
refused in one line naming the file:line, the field and the fix.

    python -c "from trainflow.evaluate.tasks import *; \
        write_task('/tmp/sum.jsonl', [MultipleChoice('2+2=', ['4', '5'], 0)]); \
        print(read_task(TaskSpec('sum', 'choice', '/tmp/sum.jsonl')))"

Two forms, one item a line (blank lines are skipped):

- `choice`, multiple choice by log-likelihood (HellaSwag, ARC, MMLU): `{"context": str, "choices": [str, ...],
  "gold": int}`. Each choice is scored as the text that follows the context exactly (a separating space belongs to
  the choice or the context, as the task's converter wrote it).
- `generate`, exact match of a greedy generation (GSM8K's form without its `#### 42` extraction): `{"question": str,
  "answer": str}`; the generation is cut at the task's stop string and compared, stripped, with the answer
  (`exact_match`).

A task file is data, never code: it is read through records.read_file (a FIFO, a device, a symlink loop or a file
past DOCUMENT_BYTES is refused) and parsed by json.loads; nothing in it is imported or evaluated. A line must hold
exactly its form's fields, each of its type (Record.from_json), so a file converted for the other form, or with a
misspelt field, fails on its first line rather than scoring something else.
"""

from __future__ import annotations

import dataclasses
import enum
import json
from dataclasses import dataclass
from pathlib import Path

from trainflow.atomic import write_text_atomic
from trainflow.config.evaluate import EvalTaskConfig
from trainflow.errors import TrainflowError
from trainflow.records import Record, RecordError, read_file

FORMS = {
    "choice": '{"context": str, "choices": [str, ...], "gold": int}',
    "generate": '{"question": str, "answer": str}',
}
"""Each kind's line, as an error shows it."""


class TaskError(TrainflowError):
    """A task file or task spec that cannot be scored."""


class TooFewDocuments(TaskError):
    """A corpus too small to build the corpus task from (corpus_task.write_corpus_task)."""


class TaskKind(enum.StrEnum):
    CHOICE = "choice"
    """Multiple choice by log-likelihood: acc and acc_norm."""
    GENERATE = "generate"
    """Greedy generation compared with the answer: exact match."""
    HARNESS = "harness"
    """An lm-evaluation-harness task (trainflow.evaluate.harness), scored as one of the two above."""


@dataclass(frozen=True)
class TaskSpec:
    """One task of an evaluation: its name (in the records and plots), its kind, its JSONL file and how many of its
    first items are scored (0: all)."""

    name: str
    kind: TaskKind | str
    path: str
    limit: int = 0
    stop: str = "\n"
    """A generate task's generation ends before this text's first occurrence ("": only at max_new_tokens or the
    end-of-document token)."""
    task: str = ""
    """A harness task's lm-eval task or group name ("": `name`); its `path` is a folder of extra task definitions
    ("": the package's own only)."""

    @classmethod
    def of(cls, t: EvalTaskConfig) -> TaskSpec:
        """The spec of one task of evaluate.tasks."""
        return cls(t.name, t.kind, t.path, t.limit, t.stop, t.task)

    def __post_init__(self) -> None:
        kinds = ", ".join(k.value for k in TaskKind)
        if self.kind not in {*TaskKind, *(k.value for k in TaskKind)}:
            raise TaskError(f"task {self.name!r} has kind {self.kind!r}; give one of {kinds}")
        object.__setattr__(self, "kind", TaskKind(self.kind))
        if self.kind is TaskKind.HARNESS and not self.task:
            object.__setattr__(self, "task", self.name)
        if type(self.limit) is not int or self.limit < 0:
            raise TaskError(f"task {self.name!r} has limit {self.limit!r}; give a number of items >= 0 (0: all)")


@dataclass(frozen=True)
class MultipleChoice(Record):
    """One multiple-choice item: the choices continue the context; `gold` indexes the right one."""

    context: str
    choices: list[str]
    gold: int

    def __post_init__(self) -> None:
        if not self.context.strip():
            raise TaskError("its context is empty; give each item the text its choices continue")
        if not self.choices:
            raise TaskError("its choices are empty; give at least two choices")
        if empty := [i for i, c in enumerate(self.choices) if not c]:
            raise TaskError(f"its choice {empty[0]} is empty (it would score 0, the highest); give each choice text")
        if not 0 <= self.gold < len(self.choices):
            raise TaskError(
                f"its gold {self.gold} is out of range for its {len(self.choices)} choices; give an index from 0 to "
                f"{len(self.choices) - 1}"
            )


@dataclass(frozen=True)
class Generation(Record):
    """One generation item: the prompt, and the text a right generation equals."""

    question: str
    answer: str

    def __post_init__(self) -> None:
        if not self.question.strip():
            raise TaskError("its question is empty; give each item the prompt to continue")


ITEMS: dict[TaskKind, type[MultipleChoice] | type[Generation]] = {
    TaskKind.CHOICE: MultipleChoice,
    TaskKind.GENERATE: Generation,
}


def read_task(spec: TaskSpec) -> list[MultipleChoice] | list[Generation]:
    """The first `spec.limit` items (0: all) of the task's file, each checked; one TaskError for the first bad line,
    a missing, empty or unreadable file."""
    if spec.kind not in ITEMS:
        raise TaskError(f"task {spec.name!r} is an lm-evaluation-harness task: trainflow.evaluate.harness scores it")
    kind = ITEMS[spec.kind]
    fix = f"write each line of task {spec.name!r} ({spec.kind.value}) as {FORMS[spec.kind.value]}"
    try:
        text = read_file(spec.path, fix=fix)
    except FileNotFoundError:
        raise TaskError(f"{spec.path} (task {spec.name!r}) is missing; give the path of its JSONL file") from None
    except RecordError as err:
        raise TaskError(str(err)) from None
    items = []
    for number, line in enumerate(text.splitlines(), 1):
        if spec.limit and len(items) == spec.limit:
            break
        if line.strip():
            items.append(parse_line(kind, line, f"{spec.path}:{number}", fix))
    if not items:
        raise TaskError(f"{spec.path} (task {spec.name!r}) holds no items; {fix}")
    return items


def parse_line(kind: type[MultipleChoice] | type[Generation], line: str, where: str, fix: str):
    """The item one line holds; one TaskError naming `where` for anything else."""
    try:
        data = json.loads(line)
    except (ValueError, RecursionError) as err:
        raise TaskError(f"{where} is not JSON ({type(err).__name__}: {str(err)[:100]}); {fix}") from None
    try:
        return kind.from_json(data, where=where)
    except RecordError as err:
        raise TaskError(f"{err}; {fix}") from None


def write_task(path: str | Path, items: list[MultipleChoice] | list[Generation]) -> None:
    """The items as a task file, one JSON object a line (their fields only, the standard form), written atomically."""
    write_text_atomic(path, "".join(json.dumps(dataclasses.asdict(item)) + "\n" for item in items))


def exact_match(generated: str, answer: str, *, collapse_whitespace: bool = False) -> bool:
    """Whether a generation (already cut at its stop string) is the answer: both stripped, or with every run of
    whitespace made one space where `collapse_whitespace`."""
    if collapse_whitespace:
        return " ".join(generated.split()) == " ".join(answer.split())
    return generated.strip() == answer.strip()
