"""The evaluate stage on a real two-step checkpoint of one process: it scores the corpus task, a task file and an
lm-evaluation-harness task, and refuses in one line a segment whose checkpoint is not there, a missing task file, a
task path a shell would read, and a task file whose gold is out of range."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.conftest import make_config, read_json
from tests.support import EXPORT_RUN, trained
from trainflow.config import ConfigError, compose
from trainflow.config.evaluate import TASK_KINDS, EvaluateConfig
from trainflow.evaluate.records import EvalRecord
from trainflow.evaluate.tasks import TaskError, TaskKind
from trainflow.preflight import evaluation_errors
from trainflow.records import read_record
from trainflow.stage import StageError
from trainflow.stages import evaluate

RUN = (*EXPORT_RUN, "parallel=single")


@pytest.fixture(scope="module")
def root(tmp_path_factory, tokens) -> Path:
    root = tmp_path_factory.mktemp("evaluate")
    trained(root, tokens, *RUN)
    return root


def task(path: Path, *lines: dict) -> str:
    path.write_text("".join(json.dumps(line) + "\n" for line in lines))
    return str(path)


def test_scores_the_corpus_task_and_task_files_of_the_segments_last_checkpoint(root, tokens, tmp_path, monkeypatch):
    """A local generate task, and an lm-evaluation-harness task defined in a folder beside its data (the json
    builder's cache in tmp_path)."""
    pytest.importorskip("lm_eval")
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf"))
    generate = task(tmp_path / "gen.jsonl", {"question": "import os\nimport ", "answer": "sys"})
    choice = task(
        tmp_path / "mc.jsonl", *({"context": f"import {m}", "choices": [" as", " os"], "gold": 0} for m in "ab")
    )
    (tmp_path / "lm").mkdir()
    (tmp_path / "lm/mc.yaml").write_text(
        f"task: mc\ndataset_path: json\ndataset_kwargs: {{data_files: {{test: {choice}}}}}\ntest_split: test\n"
        "output_type: multiple_choice\ndoc_to_text: '{{context}}'\ndoc_to_choice: '{{choices}}'\n"
        "doc_to_target: '{{gold}}'\ntarget_delimiter: ''\nmetric_list: [{metric: acc}, {metric: acc_norm}]\n"
    )
    harness = f"{{name:lm,kind:harness,path:{tmp_path}/lm,task:mc}}"
    tasks = f"evaluate.tasks=[{{name:gen,kind:generate,path:{generate},stop:'\\n'}},{harness}]"
    cfg = make_config("evaluate", root, *RUN, tasks, "evaluate.max_new_tokens=4", tokens=tokens)
    evaluate.run(cfg)
    record = read_record(EvalRecord, cfg.io.evaluation)
    assert (record.step, record.tokens) == (2, 2 * cfg.train.global_batch * cfg.model.seq_len)
    kinds = [(t.task, t.kind, t.n) for t in record.tasks]
    assert kinds == [("corpus", TaskKind.CHOICE, 16), ("gen", "generate", 1), ("lm", "choice", 2)]
    assert all(0 <= t.acc <= 1 for t in record.tasks) and record.tasks[0].acc_norm is not None
    assert len(Path(cfg.io.corpus_task).read_text().splitlines()) == 16
    ranks = read_json(make_config("train_segment", root, *RUN, tokens=tokens).io.segment_report)["evals"][-1]
    assert ranks["step"] == 2 and record.validation.keys() == ranks["sources"].keys()  # the training ranks' batches
    for name, loss in record.validation.items():
        assert loss == pytest.approx(ranks["sources"][name], rel=1e-5), name


def test_a_corpus_too_small_for_the_corpus_task_leaves_it_out_with_a_warning(root, tokens, tmp_path, caplog):
    """The Slurm campaign's three-document corpus stopped its DAG at the first evaluation before: it trains all the
    same, and the evaluation scores the tasks it has."""
    small = tmp_path / "small.jsonl"
    small.write_text("".join(json.dumps({"text": f"document {i} " * 20}) + "\n" for i in range(3)))
    cfg = make_config("evaluate", root, *RUN, f"data.corpus={small}", f"io.evaluation={tmp_path}/e.json", tokens=tokens)
    evaluate.run(cfg)
    assert read_record(EvalRecord, cfg.io.evaluation).tasks == []
    assert "No corpus task: " in caplog.text and "has 3 documents of at least 80 characters" in caplog.text


def test_a_segment_whose_checkpoint_is_not_there_is_refused_in_one_line(root, tokens, tmp_path):
    cfg = make_config("evaluate", root, *RUN, f"io.checkpoints={tmp_path}", tokens=tokens)
    with pytest.raises(StageError, match=r"segment 0's last checkpoint \(step 2\) is not in .*; train segment 0") as e:
        evaluate.run(cfg)
    assert "\n" not in str(e.value)


def test_a_task_file_with_gold_out_of_range_is_refused_in_one_line(root, tokens, tmp_path):
    bad = task(tmp_path / "bad.jsonl", {"context": "a", "choices": ["b", "c"], "gold": 2})
    cfg = make_config("evaluate", root, *RUN, f"evaluate.tasks=[{{name:bad,kind:choice,path:{bad}}}]", tokens=tokens)
    with pytest.raises(TaskError, match=r"bad.jsonl:1.*gold 2 is out of range") as e:
        evaluate.run(cfg)
    assert "\n" not in str(e.value)


@pytest.mark.parametrize(
    ("path", "why"),
    [
        ("/no/such/task.jsonl", r"evaluate.tasks\[0\].path\('/no/such/task.jsonl'\) \(task 'x'\) is no file"),
        ("/tmp/$HOME.jsonl", r"evaluate.tasks\[0\].path\('/tmp/\$HOME.jsonl'\) holds '\$'"),
        ("/tmp/../etc/t.jsonl", r"climbs out of its folder"),
    ],
)
def test_a_bad_task_path_is_refused_in_one_line_before_any_stage_runs(tmp_path, path, why):
    with pytest.raises(ConfigError, match=why) as e:
        make_config("evaluate", tmp_path, f"evaluate.tasks=[{{name:x,kind:choice,path:'{path}'}}]")
    assert "\n" not in str(e.value)


def test_every_nth_segment_and_each_phases_last_are_evaluated():
    assert EvaluateConfig(every=2).segments(5) == [1, 3, 4]
    assert EvaluateConfig().segments(3) == [0, 1, 2]
    assert EvaluateConfig(every=9).segments(3) == [2]


def test_the_configs_task_kinds_are_the_scorers_and_names_are_unique():
    assert TASK_KINDS == tuple(k.value for k in TaskKind)
    with pytest.raises(ConfigError, match="evaluate.tasks names 'corpus' twice"):
        compose("evaluate", ["evaluate.tasks=[{name:corpus,kind:choice,path:/x}]"])
    with pytest.raises(ConfigError, match="evaluate has no task"):
        compose("evaluate", ["evaluate.corpus_task=false"])


def test_a_model_one_process_cannot_hold_is_refused_until_its_evaluation_is_off():
    """The seed's 70B: 564 GB of fp32 weights while they load, in one process on one 96 GB GH200 (the pre-flight check,
    at the DAG's build and before every stage); its experiments switch evaluation off (the sharded evaluation is not
    built) and pass."""
    off = compose("train_segment", ["experiment=llama70b_alps_campaign"])
    assert off.evaluate.enabled is False and evaluation_errors(off) == []
    (error,) = evaluation_errors(compose("train_segment", ["experiment=llama70b_alps", "evaluate.enabled=true"]))
    assert error.startswith(
        "evaluate loads llama3_70b in fp32 into one process, 564 GB while its checkpoint loads, more than "
        "cluster.hardware.device_memory_gb(96)"
    ) and error.endswith("set evaluate.enabled=false")
    assert evaluation_errors(compose("train_segment", ["model.n_layers=2"])) == []  # the tiny model: megabytes
