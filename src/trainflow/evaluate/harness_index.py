"""lm-evaluation-harness imported offline and its index of tasks, without torch: what the DAG's build needs to check a
harness task's name (the scoring, which needs the model, is trainflow.evaluate.harness).

    python -c "from trainflow.config import compose; from trainflow.evaluate.harness_index import harness_name_errors; \
        print(harness_name_errors(compose('train_segment', ['evaluate.tasks=[{name:arc,kind:harness,task:arc_esy}]'])))"
"""

from __future__ import annotations

import functools
import os
from typing import TYPE_CHECKING

from trainflow.config import TrainflowConfig
from trainflow.evaluate.tasks import TaskError, TaskSpec
from trainflow.preflight import HARNESS_INSTALL, harness_folder_errors

if TYPE_CHECKING:
    from lm_eval.tasks import TaskManager


def lm_eval_modules():
    """lm_eval, imported offline; one TaskError where it is not installed."""
    os.environ["HF_DATASETS_OFFLINE"] = os.environ["HF_HUB_OFFLINE"] = "1"
    try:
        import datasets.config
        import lm_eval.evaluator
        import lm_eval.tasks
        import lm_eval.utils
    except ImportError as err:
        raise TaskError(f"lm-evaluation-harness tasks need the lm_eval package ({err}); {HARNESS_INSTALL}") from None
    datasets.config.HF_DATASETS_OFFLINE = datasets.config.HF_HUB_OFFLINE = True  # where datasets came in earlier
    sandbox_templates(lm_eval.utils)
    return lm_eval


def sandbox_templates(utils) -> None:
    """lm-eval renders every template through its module-level `env`: made Jinja's SandboxedEnvironment, with the same
    settings and filters, so a template reaches no Python attribute beyond the data (written here: lm-eval has no
    option for it)."""
    from jinja2.sandbox import SandboxedEnvironment

    if isinstance(utils.env, SandboxedEnvironment):
        return
    env = SandboxedEnvironment(loader=utils.env.loader, undefined=utils.env.undefined, keep_trailing_newline=True)
    env.filters.update(utils.env.filters)
    utils.env = env


def task_manager(specs: list[TaskSpec]) -> TaskManager:
    """lm-eval's index of its own tasks and every spec's folder (checked first, every call: preflight's
    harness_folder_errors)."""
    lm_eval_modules()
    folders = tuple(sorted({s.path for s in specs if s.path}))
    if errors := [e for f in folders for e in harness_folder_errors(f)]:
        raise TaskError(errors[0])
    return indexed(folders)


@functools.cache
def indexed(folders: tuple[str, ...]) -> TaskManager:
    """lm-eval's index (~6 s: ~12,000 definition files), built once a process for the same folders."""
    import lm_eval.tasks

    return lm_eval.tasks.TaskManager(include_path=list(folders) or None)


def harness_errors(specs: list[TaskSpec], manager: TaskManager) -> list[str]:
    """Every spec names a task (or group) the index holds."""
    import difflib

    known = set(manager.all_tasks)
    return [
        f"task {s.name!r}: lm-eval has no task {s.task!r}"
        + (f" (did you mean {close[0]!r}?)" if (close := difflib.get_close_matches(s.task, known, 1)) else "")
        + f"; give a task `python -m lm_eval ls tasks` lists{f' or one defined in {s.path}' if s.path else ''}"
        for s in specs
        if s.task not in known
    ]


def harness_name_errors(cfg: TrainflowConfig) -> list[str]:
    """Every harness task of evaluate.tasks names a task lm-eval's index holds: the DAG's build checks it once (~6 s,
    only where there is one), so a typo stops the campaign before it trains, not at its first evaluation."""
    specs = [TaskSpec.of(t) for t in cfg.evaluate.tasks if t.kind == "harness"]
    if not specs:
        return []
    try:
        return harness_errors(specs, task_manager(specs))
    except TaskError as err:
        return [str(err)]
