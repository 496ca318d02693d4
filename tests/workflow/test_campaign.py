"""A campaign that lives, through the workflow on the local profile (docs/runs.md, "A campaign that lives"): extended,
retuned, switched to a variant and back, it trains no step twice, every new segment names what changed, another model
in the same run is refused before anything is submitted, and a driver killed mid-segment is re-attached to its job
on the rerun instead of a second job training beside it."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from pathlib import Path

import pytest

from tests.conftest import REPO, make_config, read_json, run_segment
from tests.support import SNAKEMAKE, job_counts, snakemake
from trainflow.config.run_folder import RunFolder
from trainflow.resilience.ledger import jobs_ledger

LOCAL = ("--profile", str(REPO / "profiles/local"))
SMOKE = "experiment=smoke"


def run(tmp_path: Path, overrides: str, *args: str, check: bool = True) -> subprocess.CompletedProcess:
    return snakemake(tmp_path, *LOCAL, "--config", f"overrides={overrides}", *args, check=check)


def series_files(folder: Path) -> dict[str, str]:
    """The measured records of a series' train folder, by name: what no rerun of a completed segment may change."""
    return {p.name: p.read_text() for p in sorted(folder.glob("*.json")) if p.name != "run.json"}


def test_an_extended_campaign_trains_one_segment_and_a_variant_and_back_trains_none(smoke_run):
    tmp_path = smoke_run
    (train,) = (tmp_path / "runs/default/train").iterdir()
    original = series_files(train)

    extend = run(tmp_path, f"{SMOKE} train.segments=3 optim.lr=1e-3", "-n")  # docs/runs.md: extend and retune it
    assert job_counts(extend.output)["train_segment"] == 1
    run(tmp_path, f"{SMOKE} train.segments=3 optim.lr=1e-3")
    third = read_json(train / "segment-2.json")
    assert (third["start_step"], third["end_step"]) == (12, 18)
    assert third["lineage"]["continued_from"] == f"{train.name}@12"
    changed = {c["change"]["key"]: (c["change"]["before"], c["change"]["after"]) for c in third["lineage"]["changes"]}
    assert changed["optim.lr"] == (0.003, 0.001) and changed["train.segments"] == (2, 3)
    report = (tmp_path / "runs/default/report/report.md").read_text()
    assert "## Lineage" in report and "`optim.lr 0.003 -> 0.001`" in report
    kept = {k: v for k, v in series_files(train).items() if k in original and k != "terms.json"}
    assert kept == {k: v for k, v in original.items() if k != "terms.json"}  # segments 0, 1 untouched

    refused = run(tmp_path, f"{SMOKE} train.segments=3 model.dim=256", "-n", check=False)
    lines = [line for line in refused.output.splitlines() if "model.dim(256) but campaign 'default' trains" in line]
    assert refused.returncode != 0 and len(lines) == 1 and "start a new campaign with run=<new name>" in lines[0]

    before = series_files(train)
    for overrides in (
        f"{SMOKE} train.segments=3 optim.lr=1e-3 cluster.hardware.mtbf_hours=2",
        f"{SMOKE} train.segments=3 optim.lr=1e-3",
    ):
        counts = job_counts(run(tmp_path, overrides).output)
        assert "train_segment" not in counts and counts["report"] == 1  # the variant, and back: no segment reruns
    assert series_files(train) == before  # terms.json, every summary and its goodput: the original's


@pytest.mark.slow  # ~70 s: a DAG to the segment, a 100-step segment, a rerun, and the run alone to compare
def test_a_killed_driver_is_reattached_to_its_job_on_the_rerun(tmp_path, tokens):
    """The Snakemake process SIGKILLed while segment 0 trains (its stage and job train on), --unlock, rerun at once:
    the rerun waits for that job, the ledger holds one job, and the end state is the uninterrupted run's."""
    # 100 steps of at least 150 ms (rank 0 a straggler, which changes no number): the rerun starts while they train.
    overrides = f"{SMOKE} train.segments=1 train.segment_steps=100 checkpoint.interval_steps=20 fault.slow_ms=150"
    driver = subprocess.Popen(
        [*SNAKEMAKE, "--directory", str(tmp_path), *LOCAL, "--config", f"overrides={overrides}"],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    cfg = make_config("train_segment", tmp_path / "runs/default", *overrides.split(), tokens=tokens)
    steps = Path(RunFolder.steps_log(cfg.io.checkpoints))
    deadline = time.monotonic() + 300
    while not (steps.is_file() and steps.read_text().count("\n") >= 5):
        assert driver.poll() is None and time.monotonic() < deadline, "segment 0 never started training"
        time.sleep(0.5)
    os.kill(driver.pid, signal.SIGKILL)  # the driver only: its stage and the job's ranks train on
    driver.wait()
    orphan = read_json(RunFolder.live_job(cfg.io.checkpoints, 0))["waiter"]["pid"]
    snakemake(tmp_path, *LOCAL, "--config", f"overrides={overrides}", "--unlock")
    run(tmp_path, overrides)
    deadline = time.monotonic() + 30
    while Path(f"/proc/{orphan}").exists() and time.monotonic() < deadline:  # it leaves the job to the rerun
        time.sleep(0.5)
    if Path(f"/proc/{orphan}").exists():
        os.kill(orphan, signal.SIGKILL)
        pytest.fail(f"the first stage (process {orphan}) did not stand down once the rerun had its job")
    log = next((tmp_path / "runs/default/logs/train_segment").glob("*/segment-0.log")).read_text()
    assert "Re-attached to local job" in log
    jobs = jobs_ledger(cfg.io.checkpoints).read()
    assert [(j.segment, j.outcome) for j in jobs] == [(0, "completed")]  # one job trained the segment
    summary = read_json(next((tmp_path / "runs/default/train").glob("*/segment-0.json")))
    alone = run_segment(tmp_path / "alone", tokens, *overrides.split())
    assert summary["state_digest"] == alone["state_digest"]


@pytest.mark.slow
def test_each_setting_changed_with_one_more_segment_reruns_nothing_and_is_named(smoke_run):
    tmp_path = smoke_run
    (train,) = (tmp_path / "runs/default/train").iterdir()
    changes = [
        "optim.lr=1e-3",
        "cluster.hardware.mtbf_hours=2",
        "cluster.allocation.time_min=30",
        "checkpoint.interval_steps=2",
    ]
    for k, change in enumerate(changes, start=2):
        kept = series_files(train)
        overrides = f"{SMOKE} train.segments={k + 1} {' '.join(changes[: k - 1])}"
        counts = job_counts(run(tmp_path, overrides).output)
        assert counts["train_segment"] == 1, (change, counts)
        assert {n: t for n, t in series_files(train).items() if n in kept and n != "terms.json"} == {
            n: t for n, t in kept.items() if n != "terms.json"
        }
        named = [c["change"]["key"] for c in read_json(train / f"segment-{k}.json")["lineage"]["changes"]]
        assert change.split("=")[0] in named, (change, named)
        report = (tmp_path / "runs/default/report/report.md").read_text()
        assert f"`{change.split('=')[0]} " in report
    assert json.loads((train / "terms.json").read_text())["segments"] == 2 + len(changes)
