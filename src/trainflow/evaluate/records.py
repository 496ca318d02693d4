"""The records of a downstream evaluation, without torch: each item's score, each task's, and one checkpoint's, which
the report plots against the tokens the checkpoint was trained on.

    python -c "from trainflow.evaluate.records import ScoredChoice, TaskScore; \
        print(TaskScore.of_choices('arc', [ScoredChoice([-3.0, -1.0], [5, 1], gold=1)]))"

acc is the share of items whose highest log-likelihood is the gold choice's; acc_norm ranks the choices by their
log-likelihood divided by their length in characters (lm-evaluation-harness's `completion_len`, `len(choice)` of the
Python string: characters, not bytes or tokens), which stops long choices losing for their length alone.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from trainflow.evaluate.tasks import TaskKind
from trainflow.records import Record


@dataclass(frozen=True)
class ScoredChoice(Record):
    """One multiple-choice item scored: each choice's summed log-probability given the context."""

    loglikelihoods: list[float]
    lengths: list[int]
    """Each choice's length in characters (acc_norm's divisor)."""
    gold: int

    @property
    def predicted(self) -> int:
        return max(range(len(self.loglikelihoods)), key=lambda i: self.loglikelihoods[i])

    @property
    def predicted_norm(self) -> int:
        return max(range(len(self.loglikelihoods)), key=lambda i: self.loglikelihoods[i] / self.lengths[i])


@dataclass(frozen=True)
class ScoredGeneration(Record):
    """One generation item scored: the greedy generation, cut at the stop string, and whether it is the answer."""

    generated: str
    answer: str
    correct: bool


@dataclass(frozen=True)
class TaskScore(Record):
    """One task's score on one checkpoint."""

    task: str
    kind: TaskKind
    n: int
    """Items scored."""
    acc: float
    """Multiple choice: the share of items whose argmax is gold; generation: the share of exact matches."""
    acc_norm: float | None
    """Multiple choice: acc with each log-likelihood divided by its choice's characters; None for generation."""

    @classmethod
    def of_choices(cls, task: str, scored: list[ScoredChoice]) -> TaskScore:
        n = len(scored)
        acc = sum(s.predicted == s.gold for s in scored) / n
        acc_norm = sum(s.predicted_norm == s.gold for s in scored) / n
        return cls(task, TaskKind.CHOICE, n, acc, acc_norm)

    @classmethod
    def of_generations(cls, task: str, scored: list[ScoredGeneration]) -> TaskScore:
        return cls(task, TaskKind.GENERATE, len(scored), sum(s.correct for s in scored) / len(scored), None)


@dataclass(frozen=True)
class EvalRecord(Record):
    """One checkpoint's evaluation: where it lies in its series, and every task's score."""

    series: str
    step: int
    tokens: int
    """Tokens trained on up to the checkpoint: the report's x axis."""
    tasks: list[TaskScore]
    seconds: float
    """Wall time of scoring its tasks and validation losses (the caller measures it: whether loading the model counts is
    its choice; the evaluate stage's does not)."""
    validation: dict[str, float] = field(default_factory=dict)
    """Each data source's validation loss on train.eval_batches batches of its split, the batches the training ranks
    draw (the evaluate stage); empty where none was computed."""
