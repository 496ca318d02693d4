"""The evaluate stage's settings (cfg.evaluate): which downstream tasks score which checkpoints, beside training.

    python -m trainflow.stages.evaluate segment=0 'evaluate.tasks=[{name:arc,kind:choice,path:/data/arc.jsonl}]'

A task file is data on local disk (trainflow.evaluate.tasks reads it: one JSON object a line, nothing imported or
evaluated); its path is checked here as text (config.security: no quote, `$` or control character, no '..') and for
existence before any stage runs (trainflow.preflight.task_errors). A `harness` task is lm-evaluation-harness's
(trainflow.evaluate.harness: `{name: arc, kind: harness, task: arc_easy}`), its path a folder of extra task
definitions or "" for the package's own.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from trainflow.config.domain import RUN_NAME, checked

CORPUS_TASK = "corpus"
"""The corpus task's name in the records and the report (no task of evaluate.tasks may take it)."""
TASK_KINDS = ("choice", "generate", "harness")
"""trainflow.evaluate.tasks.TaskKind's values (tests/unit/test_evaluate_stage.py holds them equal): config/ is below
evaluate/ and cannot import it."""


@dataclass
class EvalTaskConfig:
    """One task file (trainflow.evaluate.tasks.TaskSpec's fields)."""

    name: str = checked(pattern=RUN_NAME, fix="letters, digits, _ . - and no leading dot")
    """How the records, the report and its plot name the task."""
    kind: str = checked(one_of=TASK_KINDS)
    """choice: multiple choice by log-likelihood (acc, acc_norm); generate: greedy generation, exact match; harness:
    an lm-evaluation-harness task, scored as one of these by its output type."""
    path: str = ""
    """choice, generate: the task's JSONL file on local disk; harness: a folder of extra lm-eval task definitions
    (YAML, read as data), "" for the package's own tasks only."""
    task: str = checked("", pattern=r"[\w.-]*", fix="an lm-eval task or group name, e.g. arc_easy or mmlu")
    """harness only: the lm-eval task or group ("": `name`)."""
    limit: int = checked(0, ge=0)
    """Score only the first `limit` items (0: all)."""
    stop: str = "\n"
    """generate only: the generation ends before this text ("": at max_new_tokens or the end-of-document token)."""


@dataclass
class EvaluateConfig:
    enabled: bool = True
    """false: no evaluate jobs (the report and trainflow.status show none). A model whose fp32 weights one process
    cannot hold twice over (while they load) is refused with it on: its evaluation needs the model spread over ranks
    as training holds it, which is not built (trainflow.preflight.evaluation_errors)."""
    tasks: list[EvalTaskConfig] = field(default_factory=list)
    """Task files scored on every evaluated checkpoint, besides the corpus task."""
    every: int = checked(1, ge=1)
    """Evaluate every Nth segment's last checkpoint of each phase (segments N-1, 2N-1, ...); each phase's last segment
    is always evaluated. 1: every segment."""
    max_new_tokens: int = checked(32, ge=1)
    """The longest greedy generation of a generate task."""
    corpus_task: bool = True
    """Also score the multiple-choice task built from the run's own corpus (trainflow.evaluate.corpus_task): the run
    has a task without any file downloaded."""
    corpus_documents: int = checked(16, ge=4)
    """Items of the corpus task: its first documents long enough for a context and a choice."""
    corpus_context_chars: int = checked(64, ge=1)
    corpus_choice_chars: int = checked(16, ge=1)
    corpus_seed: int = checked(0, ge=0)
    """Shuffles each item's choices."""

    def segments(self, segments: int) -> list[int]:
        """The segments (of a phase of `segments`) whose last checkpoint is evaluated."""
        return [i for i in range(segments) if (i + 1) % self.every == 0 or i == segments - 1]


def evaluate_errors(e: EvaluateConfig) -> list[str]:
    """Task names unique, and at least one task to score."""
    names = [t.name for t in e.tasks] + ([CORPUS_TASK] if e.corpus_task else [])
    errors = [
        f"evaluate.tasks names {name!r} twice (the corpus task is {CORPUS_TASK!r}); give each task its own name"
        for name in sorted(set(names))
        if names.count(name) > 1
    ]
    if not names:
        errors.append("evaluate has no task: evaluate.tasks is empty and evaluate.corpus_task=false; give one")
    for i, t in enumerate(e.tasks):
        if t.kind != "harness" and not t.path.strip():
            errors.append(f"evaluate.tasks[{i}] ({t.name!r}, {t.kind}) has no path; give its JSONL file")
        if t.kind != "harness" and t.task:
            errors.append(f"evaluate.tasks[{i}] ({t.name!r}) names task {t.task!r}, which only kind=harness reads")
    return errors
