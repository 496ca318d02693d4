"""The workflow's config: Snakemake's own refused in trainflow's one line (not its JSON schema's dump) before any stage
runs; a mixture (data.sources) planned as one tokenising job per shard of each source, a source without files
stopping the DAG in one line, and a new weight rerunning training but not the tokenising."""

from __future__ import annotations

import pytest

from tests.conftest import REPO
from tests.support import job_counts, snakemake


def test_a_run_name_that_is_no_name_is_one_line(tmp_path):
    result = snakemake(tmp_path, "--profile", str(REPO / "profiles/local"), "--config", "run=..", "-n", check=False)
    assert result.returncode != 0
    lines = [line for line in result.output.splitlines() if "must be a plain name" in line]
    assert len(lines) == 1 and lines[0].startswith("--config run('..')"), result.output[-2000:]
    assert "Failed validating" not in result.output and not (tmp_path / "runs").exists()


def test_a_mixture_plans_a_job_per_shard_of_every_source_and_a_source_without_files_stops_the_dag(tmp_path):
    profile = ("--profile", str(REPO / "profiles/local"))
    mix = "overrides=experiment=smoke data=stdlib_mix data.sources.1.shards=2"
    counts = job_counts(snakemake(tmp_path, *profile, "--config", mix, "-n").output)
    assert counts["prepare_data_shard"] == 3 and counts["prepare_data"] == 1
    empty = snakemake(tmp_path, *profile, "--config", f"{mix} data.sources.1.corpus=/no/such/*.py", "-n", check=False)
    lines = [line for line in empty.output.splitlines() if "matched no files" in line]
    assert empty.returncode != 0 and len(lines) == 1 and lines[0].startswith("data.sources[1].corpus('/no/such/*.py')")
    assert not (tmp_path / "runs").exists()


@pytest.mark.slow
def test_a_mixture_runs_the_dag_reports_each_source_and_a_new_weight_reruns_only_training(tmp_path):
    profile, mix = ("--profile", str(REPO / "profiles/local")), "overrides=experiment=smoke data=stdlib_mix"
    snakemake(tmp_path, *profile, "--config", mix)
    report = (tmp_path / "runs/default/report/report.md").read_text()
    assert "### Data mixture" in report and "| `modules` | 75.0% |" in report and "| `email` | 25.0% |" in report
    counts = job_counts(snakemake(tmp_path, *profile, "--config", f"{mix} data.sources.0.weight=0.5", "-n").output)
    assert "prepare_data" not in counts and "prepare_data_shard" not in counts and "stage_data" not in counts
    assert counts["train_segment"] == 2
