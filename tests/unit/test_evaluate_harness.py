"""trainflow.evaluate.harness: lm-evaluation-harness's own pipeline (its task definitions, requests, filters and
metrics) run on a trainflow model scores a task exactly as the local forms' scorer scores the same items (acc,
acc_norm, exact match; acc_norm is lm-eval's own computation, ours is independent); offline, a task whose data is not
on disk, an unknown task, a sampling or perplexity task are refused in one line; a folder of definitions that would
import code, reach for a file by path or render a template beyond its document runs nothing."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from trainflow.config import compose
from trainflow.config.evaluate import EvalTaskConfig, EvaluateConfig, evaluate_errors
from trainflow.data.tokenizer import ByteTokenizer
from trainflow.evaluate import harness, harness_index
from trainflow.evaluate.score import generate, score_choices, score_task
from trainflow.evaluate.tasks import Generation, MultipleChoice, TaskError, TaskSpec, write_task
from trainflow.model import Llama
from trainflow.preflight import preflight, task_errors

pytest.importorskip("lm_eval")  # installed with the test extras; trainflow itself runs without it

TINY = ["model.n_layers=2", "model.dim=64", "model.seq_len=48", "model.init_std=0.3"]
CHOICE = """task: tiny_choice
dataset_path: json
dataset_kwargs: {{data_files: {{test: {data}}}}}
test_split: test
output_type: {output_type}
doc_to_text: "{text}"
doc_to_choice: "{{{{choices}}}}"
doc_to_target: "{{{{gold}}}}"
target_delimiter: ""
metric_list: [{{metric: acc}}, {{metric: acc_norm}}]
"""
GENERATE = """task: tiny_generate
dataset_path: json
dataset_kwargs: {{data_files: {{test: {data}}}}}
test_split: test
output_type: generate_until
doc_to_text: "{{{{question}}}}"
doc_to_target: "{{{{answer}}}}"
target_delimiter: ""
generation_kwargs: {{until: ["\\n", "."], do_sample: {sample}, max_gen_toks: 8}}
metric_list: [{{metric: exact_match}}]
"""


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    """A tiny random model, its byte tokenizer, both local task files, a folder defining them for lm-eval, and lm-eval's
    index of it and its own tasks (~6 s, built once)."""
    root = tmp_path_factory.mktemp("harness")
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("HF_HOME", str(root / "hf"))  # the json builder's cache, out of the user's home
        torch.manual_seed(0)
        model, tokenizer = Llama(compose("train_segment", TINY).model).eval(), ByteTokenizer()
        choices = [" a", " bb", " cccccc", "d", " e.f"]
        items = [MultipleChoice(f"item {i} says {'x' * i}", choices, 0) for i in range(15)]
        # gold: the raw argmax for two items in three, the length-normalised one for the third: acc != acc_norm
        gold = [
            s.predicted if i % 3 else s.predicted_norm for i, s in enumerate(score_choices(model, tokenizer, items))
        ]
        write_task(root / "choice.jsonl", [dataclasses.replace(item, gold=g) for item, g in zip(items, gold)])
        prompts = [f"q{i}:" for i in range(6)]  # half the answers are the model's own greedy continuation
        answers = [
            generate(model, tokenizer, q, max_new_tokens=8, stop=("\n", ".")) if i % 2 else "zz"
            for i, q in enumerate(prompts)
        ]
        write_task(root / "generate.jsonl", [Generation(q, a) for q, a in zip(prompts, answers)])
        folder = root / "tasks"
        folder.mkdir()
        text = "{{context}}"
        (folder / "choice.yaml").write_text(
            CHOICE.format(data=root / "choice.jsonl", output_type="multiple_choice", text=text)
        )
        (folder / "generate.yaml").write_text(GENERATE.format(data=root / "generate.jsonl", sample="false"))
        specs = [TaskSpec(n, "harness", str(folder)) for n in ("tiny_choice", "tiny_generate")]
        manager = harness_index.task_manager(specs)
        yield root, model, tokenizer, specs, manager


def score(setup, spec: TaskSpec):
    _, model, tokenizer, _, manager = setup
    return harness.score_harness(model, tokenizer, spec, manager, max_new_tokens=8)


def test_harness_tasks_score_as_the_local_forms(setup):
    root, model, tokenizer, (choice, generation), _ = setup
    ours = score_task(model, tokenizer, TaskSpec("tiny_choice", "choice", str(root / "choice.jsonl")))
    assert score(setup, choice) == ours
    assert ours.acc != ours.acc_norm  # the choices' lengths decide: acc_norm's divisor is tested, not bypassed
    ours = score_task(
        model, tokenizer, TaskSpec("tiny_generate", "generate", str(root / "generate.jsonl")), max_new_tokens=8
    )
    assert ours.acc == 0.5
    assert score(setup, generation) == ours
    assert score(setup, TaskSpec("tiny_choice", "harness", choice.path, limit=4)).n == 4


def test_a_task_whose_data_is_not_on_disk_is_refused_offline(setup):
    with pytest.raises(TaskError, match=r"cannot load 'arc_easy' offline .*once where there is network") as err:
        score(setup, TaskSpec("arc", "harness", "", task="arc_easy"))
    assert "\n" not in str(err.value)


def test_an_unknown_task_is_named_with_the_closest(setup):
    assert harness_index.harness_errors([TaskSpec("arc", "harness", "", task="arc_esy")], setup[4]) == [
        "task 'arc': lm-eval has no task 'arc_esy' (did you mean 'arc_easy'?); give a task "
        "`python -m lm_eval ls tasks` lists"
    ]


def write_definition(setup, name: str, text: str):
    folder = setup[0] / name
    folder.mkdir(exist_ok=True)
    (folder / f"{name}.yaml").write_text(text)
    return str(folder)


@pytest.mark.parametrize(
    ("name", "line", "refusal"),
    [
        ("sampling", None, "asks to sample"),
        ("perplexity", "loglikelihood_rolling", "is a loglikelihood_rolling task"),
        ("escape", "multiple_choice", "reaches beyond its document"),
    ],
)
def test_tasks_trainflow_cannot_score_are_refused(setup, name, line, refusal):
    root = setup[0]
    data = root / "choice.jsonl"
    if name == "sampling":
        text = GENERATE.format(data=root / "generate.jsonl", sample="true").replace("tiny_generate", name)
    else:
        escape = "{{ context.__class__.__mro__[1].__subclasses__() }}"
        text = CHOICE.format(data=data, output_type=line, text=escape if name == "escape" else "{{context}}")
        text = text.replace("tiny_choice", name)
    spec = TaskSpec(name, "harness", write_definition(setup, name, text))
    manager = harness_index.lm_eval_modules().tasks.TaskManager(include_path=spec.path, include_defaults=False)
    with pytest.raises(TaskError, match=refusal) as err:
        harness.score_harness(setup[1], setup[2], spec, manager, max_new_tokens=8)
    assert "\n" not in str(err.value)


@pytest.mark.parametrize(
    "line",
    ["process_docs: !function evil.process_docs", "include: ../../outside/evil.yaml"],
)
def test_a_definition_folder_that_imports_code_runs_nothing(setup, tmp_path, line):
    marker = tmp_path / "ran"
    folder = write_definition(setup, f"evil{len(line)}", f"task: evil\ndataset_path: json\n{line}\n")
    (setup[0] / f"evil{len(line)}" / "evil.py").write_text(f"open({str(marker)!r}, 'w').close()\n")
    with pytest.raises(TaskError, match="a task folder is read as data"):
        harness_index.task_manager([TaskSpec("evil", "harness", folder)])
    assert not marker.exists()
    cfg = compose("evaluate", [f"evaluate.tasks=[{{name:evil,kind:harness,path:{folder}}}]"])
    assert [e for e in task_errors(cfg) if "read as data" in e]


def test_config_refuses_a_local_task_without_its_file_and_a_task_name_it_does_not_read():
    tasks = [EvalTaskConfig("a", "choice"), EvalTaskConfig("b", "generate", "b.jsonl", task="gsm8k")]
    assert evaluate_errors(EvaluateConfig(tasks=tasks)) == [
        "evaluate.tasks[0] ('a', choice) has no path; give its JSONL file",
        "evaluate.tasks[1] ('b') names task 'gsm8k', which only kind=harness reads",
    ]


def test_the_dags_build_refuses_an_unknown_harness_task_before_anything_trains(setup):
    cfg = compose("train_segment", ["evaluate.tasks=[{name:arc,kind:harness,task:arc_esy}]"])
    assert task_errors(cfg) == []
    (error,) = harness_index.harness_name_errors(cfg)
    assert "lm-eval has no task 'arc_esy' (did you mean 'arc_easy'?)" in error
    preflight(cfg)  # a stage's own check leaves the name to the DAG's build and the evaluate job
