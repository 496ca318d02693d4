"""What a run folder's campaign allows (trainflow.campaign): the same model under a run's name, its series' seed, a
branch's checkpoint; each refusal one line naming the field, both values and the fix. And its records: a record of a
newer format refused in one line, an older one migrated (records)."""

from __future__ import annotations

import json
from dataclasses import dataclass

import pytest

from tests.conftest import make_config
from trainflow.campaign.check import check_campaign, start_series
from trainflow.campaign.records import StepChange
from trainflow.config import ConfigError
from trainflow.config.identity import Change, changes, settings
from trainflow.config.run_folder import RunFolder
from trainflow.journal import Journal
from trainflow.records import NewerFormatError, Record, RecordError, read_record
from trainflow.train.run_record import RunRecord


@pytest.fixture
def started(tmp_path):
    cfg = make_config("train_segment", tmp_path)
    check_campaign(cfg)
    start_series(cfg)
    return tmp_path


@pytest.mark.parametrize(
    ("override", "line"),
    [
        ("model.dim=256", "model.dim(256) but campaign 'default' trains model.dim=128"),
        ("data.tokenizer=bpe", "data.tokenizer('bpe') but campaign 'default' trains data.tokenizer='byte'"),
        (
            "model.rope_scaling=llama3",
            "model.rope_scaling('llama3') but campaign 'default' trains model.rope_scaling='none'",
        ),
    ],
)
def test_another_model_in_the_same_run_is_refused_in_one_line(started, override, line):
    with pytest.raises(ConfigError) as err:
        check_campaign(make_config("train_segment", started, override))
    text = str(err.value)
    assert "\n" not in text and line in text and "start a new campaign with run=<new name>" in text


def test_every_setting_continues_the_campaign(started):
    for override in ("optim.lr=1e-4", "parallel=tp2", "train.segments=9", "cluster.hardware.mtbf_hours=2"):
        check_campaign(make_config("train_segment", started, override))


def test_another_seed_is_refused_unless_it_branches(started):
    with pytest.raises(
        ConfigError, match=r"train\.seed\(7\) but series \w+ of campaign 'default' draws its data with "
    ):
        check_campaign(make_config("train_segment", started, "train.seed=7"))
    with pytest.raises(ConfigError, match=r"holds no checkpoint of step 6 .* \(its newest: none\); branch from one of"):
        check_campaign(make_config("train_segment", started, "train.seed=7", "train.branch_from=6"))


@pytest.mark.parametrize("spec", ["abc", "6@6", "000000000000@6", "-1"])
def test_a_branch_that_names_no_series_of_the_campaign_is_refused_in_one_line(tmp_path, spec):
    with pytest.raises(ConfigError, match=r"train\.branch_from") as err:
        make_config("train_segment", tmp_path, f"train.branch_from={spec}")
    assert "\n" not in str(err.value)


def test_a_branch_is_named_by_its_parent_and_step(tmp_path):
    main = RunFolder.of(make_config("train_segment", tmp_path)).series
    branch = RunFolder.of(make_config("train_segment", tmp_path, "train.branch_from=6")).series
    again = RunFolder.of(make_config("train_segment", tmp_path, f"train.branch_from={branch}@9")).series
    assert (branch, again) == (f"{main}-b6", f"{main}-b6-b9")


def test_a_change_is_every_setting_that_differs():
    before = settings(make_config("train_segment", "/x"))
    after = settings(make_config("train_segment", "/x", "optim.lr=1e-4", "parallel=tp2"))
    found = {c.key: (c.before, c.after) for c in changes(before, after)}
    assert found["optim.lr"] == (0.003, 0.0001) and found["parallel.tp"] == (1, 2) and found["parallel.dp"] == (2, 1)
    assert "model.dim" not in before and "train.seed" not in before and "io.checkpoints" not in before
    assert changes(None, after) == []  # nothing recorded to compare with (a format-1 checkpoint)
    line = StepChange(12, 2, Change("optim.lr", 0.003, 0.0001))
    journal = Journal(f"{make_config('train_segment', '/x').storage.root}/never", StepChange)
    assert line.change.line() == "optim.lr 0.003 -> 0.0001" and journal.read() == []


@dataclass(frozen=True)
class Thing(Record):
    FORMAT = 3
    MIGRATIONS = {1: lambda d: {**d, "b": 0}, 2: lambda d: {**{k: v for k, v in d.items() if k != "a"}, "c": d["a"]}}

    b: int
    c: int


def test_an_older_document_is_migrated_step_by_step_and_a_newer_one_refused(tmp_path):
    path = tmp_path / "thing.json"
    path.write_text(json.dumps({"a": 5}))  # format 1: no format key
    assert read_record(Thing, path) == Thing(b=0, c=5)
    path.write_text(json.dumps({"format": 2, "a": 5, "b": 1}))
    assert read_record(Thing, path) == Thing(b=1, c=5)
    assert json.loads(json.dumps(Thing(1, 2).to_json())) == {"format": 3, "b": 1, "c": 2}
    path.write_text(json.dumps({"format": 4, "b": 1, "c": 2}))
    with pytest.raises(NewerFormatError) as err:
        read_record(Thing, path, rerun="the thing stage")
    assert str(err.value) == (
        f"{path} is Thing format 4, written by a newer trainflow than this one (which reads formats up to 3): upgrade "
        "trainflow to read it; nothing was changed"
    )
    for bad in ("2", 0, True):
        path.write_text(json.dumps({"format": bad, "b": 1, "c": 2}))
        with pytest.raises(RecordError, match="not a format number"):
            read_record(Thing, path)
    path.write_text(json.dumps({"format": 1}))  # a hostile format-1 document: its migration fails in one line
    with pytest.raises(RecordError, match=r"is Thing format 2 but does not read as one \(KeyError\('a'\)\)"):
        read_record(Thing, path)


def test_a_run_record_of_format_1_names_its_series_and_planned_steps():
    old = {"run": "r", "train_hash": "abc", "segments": 3, "segment_steps": 50, "tokens_per_step": 1, "world_size": 2}
    record = RunRecord.from_json({**old, "checkpoints": "c", "segment": 1, "written": 0.0})
    assert (record.series, record.total_steps) == ("abc", 150)
