"""lm-evaluation-harness's task definitions scored on a trainflow model: its tasks (their prompts, few-shot contexts,
filters and metrics) run through `lm_eval.evaluator.evaluate`, the model answering as an `lm_eval.api.model.LM`
(the package's documented way to evaluate a model it does not know), whose requests trainflow.evaluate.score computes.

    python -c "from trainflow.evaluate.harness_index import task_manager, harness_errors; \
        from trainflow.evaluate.tasks import TaskSpec; \
        print(harness_errors([TaskSpec('arc', 'harness', '', task='arc_easy')], task_manager([])))"

Nothing downloads at run time: HF_DATASETS_OFFLINE and HF_HUB_OFFLINE are set before `datasets` is imported, so a
task reads its data from the Hugging Face cache ($HF_HOME, filled once where there is network) or from local files
its definition names (`dataset_path: json` with `dataset_kwargs.data_files`); a task whose data is not on disk is
refused in one line that says how to put it there.

A task's score is recorded as the two local forms' are (records.TaskScore): `multiple_choice` and `loglikelihood`
tasks as choice (acc, and acc_norm where the task reports it), `generate_until` tasks as generate (exact_match under
the task's first filter). A perplexity task (`loglikelihood_rolling`) is refused: the stage's validation losses are
the run's perplexity. Generation is greedy: a task asking to sample is refused.

A folder of extra task definitions (a task's `path`, lm-eval's `include_path`) is read as data, as every file a user
names is: a definition that imports Python (`!function`) or includes a file by path is refused before lm-eval reads
it (trainflow.preflight.harness_folder_errors), and every template renders in Jinja's sandbox (lm-eval's own
environment runs whatever a template calls). The package's own task definitions are installed code and load as
lm-eval loads them. The DAG's build checks every harness task's name (harness_index.harness_name_errors, without
torch).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from trainflow.evaluate.harness_index import harness_errors, lm_eval_modules
from trainflow.evaluate.records import TaskScore
from trainflow.evaluate.score import Tokenizer
from trainflow.evaluate.tasks import TaskError, TaskKind, TaskSpec
from trainflow.model import Llama

if TYPE_CHECKING:
    from lm_eval.tasks import TaskManager

SCORED = {"multiple_choice": TaskKind.CHOICE, "loglikelihood": TaskKind.CHOICE, "generate_until": TaskKind.GENERATE}
"""The output types a task may have, and the form its score is recorded in."""


def score_harness(
    model: Llama, tokenizer: Tokenizer, spec: TaskSpec, manager: TaskManager, *, max_new_tokens: int
) -> TaskScore:
    """The spec's lm-eval task (or group) scored on the model: its first `spec.limit` documents of each task (0:
    all), bootstrap standard errors left out."""
    lm_eval = lm_eval_modules()
    if errors := harness_errors([spec], manager):
        raise TaskError(errors[0])
    from jinja2.exceptions import SecurityError

    try:
        loaded = manager.load([spec.task])
    except SecurityError as err:
        raise unsafe_template(spec, err) from None
    except Exception as err:  # lm-eval and datasets raise many types; a missing dataset is the usual one
        reason = " ".join(str(err).split())[:300]
        raise TaskError(
            f"task {spec.name!r}: lm-eval cannot load {spec.task!r} offline ({type(err).__name__}: {reason}); put its "
            "data on disk first: run `python -c \"import lm_eval.tasks as t; t.TaskManager().load(['"
            f"{spec.task}'])\"` once where there is network, with HF_HOME on storage the evaluate jobs read"
        ) from None
    kinds = {task.OUTPUT_TYPE for task in loaded["tasks"].values()}
    if unscored := kinds - set(SCORED):
        raise TaskError(
            f"task {spec.name!r}: lm-eval's {spec.task!r} is a {sorted(unscored)[0]} task; trainflow records "
            f"{', '.join(SCORED)} tasks (the evaluate stage's validation losses are the run's perplexity)"
        )
    from trainflow.evaluate.harness_lm import TrainflowLM  # lm_eval's subclass: only once lm_eval is imported offline

    lm = TrainflowLM(model, tokenizer, spec.name, max_new_tokens=max_new_tokens)
    try:
        out = lm_eval.evaluator.evaluate(lm, loaded, limit=spec.limit or None, bootstrap_iters=0, log_samples=False)
    except SecurityError as err:
        raise unsafe_template(spec, err) from None
    return task_score(spec, out, SCORED[kinds.pop()] if len(kinds) == 1 else TaskKind.CHOICE)


def unsafe_template(spec: TaskSpec, err: Exception) -> TaskError:
    return TaskError(
        f"task {spec.name!r}: a template of {spec.task!r} reaches beyond its document ({err}); write templates that "
        "read the document's fields only"
    )


def task_score(spec: TaskSpec, out: dict[str, Any], kind: TaskKind) -> TaskScore:
    """The record of lm-eval's results for the spec's task (a group's aggregate where it names a group)."""
    results = out["results"].get(spec.task, {})
    metric = "acc" if kind is TaskKind.CHOICE else "exact_match"
    value = next((v for k, v in results.items() if k.split(",")[0] == metric and isinstance(v, (int, float))), None)
    if value is None:
        raise TaskError(
            f"task {spec.name!r}: lm-eval's {spec.task!r} reports no {metric} (it reports "
            f"{sorted(k.split(',')[0] for k in results) or 'nothing'}); give a task scored by {metric}"
        )
    norm = next((v for k, v in results.items() if k.split(",")[0] == "acc_norm"), None)
    n = sum(count["effective"] for count in out["n-samples"].values())
    return TaskScore(spec.name, kind, n, float(value), None if norm is None else float(norm))
