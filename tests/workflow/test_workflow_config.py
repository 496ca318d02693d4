"""The workflow's config: Snakemake's own refused in trainflow's one line (not its JSON schema's dump) before any stage
runs; a mixture (data.sources) planned as one tokenising job per shard of each source, a source without files
stopping the DAG in one line, and a new weight rerunning training but not the tokenising."""

from __future__ import annotations

import math
import os
import re
import time

import pytest

from tests.conftest import REPO
from tests.support import job_counts, snakemake
from trainflow.preflight import RANKS_PER_CORE


def test_a_run_name_that_is_no_name_is_one_line(tmp_path):
    result = snakemake(tmp_path, "--profile", str(REPO / "profiles/local"), "--config", "run=..", "-n", check=False)
    assert result.returncode != 0
    lines = [line for line in result.output.splitlines() if "must be a plain name" in line]
    assert len(lines) == 1 and lines[0].startswith("--config run('..')"), result.output[-2000:]
    assert "Failed validating" not in result.output and not (tmp_path / "runs").exists()


def test_a_number_for_a_run_gets_a_fix_that_works_through_snakemakes_own_config_parsing(tmp_path):
    """--config run=123 arrives as the int 123 and a quoted '123' as well (Snakemake strips the quotes); the fix the
    line gives, YAML's !!str tag, reaches the workflow as the name 123 and plans runs/123/."""
    profile = ("--profile", str(REPO / "profiles/local"))
    for given in ("run=123", "run='123'"):
        result = snakemake(tmp_path, *profile, "--config", given, "-n", check=False)
        lines = [line for line in result.output.splitlines() if line.startswith("--config run(123)")]
        assert result.returncode != 0 and len(lines) == 1, result.output[-2000:]
    fix = re.search(r"keep it text with --config '(.+?)'", lines[0])[1]
    planned = snakemake(tmp_path, *profile, "--config", fix, "-n").output
    assert "runs/123/report/report.md" in planned and "runs/None" not in planned
    assert not (tmp_path / "runs").exists()


def test_an_empty_run_is_refused_and_empty_overrides_are_none(tmp_path):
    profile = ("--profile", str(REPO / "profiles/local"))
    result = snakemake(tmp_path, *profile, "--config", "run=", "-n", check=False)
    lines = [line for line in result.output.splitlines() if line.startswith("--config run= is empty")]
    assert result.returncode != 0 and len(lines) == 1 and "run='None'" not in result.output, result.output[-2000:]
    assert "runs/default/report/report.md" in snakemake(tmp_path, *profile, "--config", "overrides=", "-n").output


def test_a_mixture_plans_a_job_per_shard_of_every_source_and_a_source_without_files_stops_the_dag(tmp_path):
    profile = ("--profile", str(REPO / "profiles/local"))
    mix = "overrides=experiment=smoke data=stdlib_mix data.sources.1.shards=2"
    planned = snakemake(tmp_path, *profile, "--config", mix, "-n").output
    counts = job_counts(planned)
    assert counts["prepare_data_shard"] == 3 and counts["prepare_data"] == 1
    # Issue 43, case 8: the smoke preset's 12 steps cannot fill the spike guard's window of 50, and as a test run it
    # is not told so on every dry run (config.rules.spike_warning)
    assert not [line for line in planned.splitlines() if line.startswith("train.spike.window(")]
    empty = snakemake(tmp_path, *profile, "--config", f"{mix} data.sources.1.corpus=/no/such/*.py", "-n", check=False)
    lines = [line for line in empty.output.splitlines() if "matched no files" in line]
    assert empty.returncode != 0 and len(lines) == 1 and lines[0].startswith("data.sources[1].corpus('/no/such/*.py')")
    assert not (tmp_path / "runs").exists()


LOCAL_RANKS = 2 ** math.ceil(math.log2(RANKS_PER_CORE * len(os.sched_getaffinity(0)) + 1))
"""More local ranks than this machine's cores run (the issue gave parallel.cp=64 at dp2: 128 ranks on 2 cores)."""


@pytest.mark.parametrize(
    ("overrides", "start"),
    [
        ("train.segments=1000000000", "invalid config: train.segments(1000000000) must be <= 4096 ("),
        (
            f"parallel.cp={LOCAL_RANKS // 2}",
            f"config cannot run here: the local world of {LOCAL_RANKS} ranks (dp(2) * cp({LOCAL_RANKS // 2}) * ",
        ),
    ],
)
def test_a_shape_no_machine_holds_ends_the_dag_build_in_one_line_in_seconds(tmp_path, overrides, start):
    """Issue 43, case 4: a billion segments hung the DAG's build until memory ran out; 128 local ranks were accepted."""
    begun = time.monotonic()
    config = ("--config", f"overrides={overrides}")
    result = snakemake(tmp_path, "--profile", str(REPO / "profiles/local"), *config, "-n", check=False)
    seconds = time.monotonic() - begun
    lines = [line for line in result.output.splitlines() if line.startswith(start)]
    assert result.returncode != 0 and len(lines) == 1 and seconds < 10, (seconds, result.output[-2000:])
    assert not (tmp_path / "runs").exists()


def test_a_corpus_path_with_parentheses_quoted_as_the_page_says_plans_its_dag(tmp_path):
    """Issue 43, case 7: `overrides="data.corpus='<dir>/my data (2024)/*.txt'"`, docs/configuration.md's quoting, was
    refused as unbalanced quotes (Snakemake drops the closing quote; the parentheses then reached Hydra bare)."""
    corpus = tmp_path / "my data (2024)"
    corpus.mkdir()
    (corpus / "a.txt").write_text("text with (parentheses) " * 200)
    given = f"overrides=experiment=smoke data.corpus='{corpus}/*.txt'"  # as the shell passes overrides="..."
    planned = snakemake(tmp_path, "--profile", str(REPO / "profiles/local"), "--config", given, "-n").output
    assert job_counts(planned)["prepare_data_shard"] == 1 and not (tmp_path / "runs").exists()


def test_a_run_given_as_a_list_is_told_a_name_that_works(tmp_path):
    """Issue 43, case 7: `run=[a]` (YAML's list) was told `name it run=r['a']`, which is refused in turn."""
    profile = ("--profile", str(REPO / "profiles/local"))
    result = snakemake(tmp_path, *profile, "--config", "run=[a]", "-n", check=False)
    (line,) = [line for line in result.output.splitlines() if line.startswith("--config run(['a'])")]
    fix = re.search(r"e\.g\. (run=\S+)$", line)[1]
    assert result.returncode != 0 and fix == "run=a"
    assert "runs/a/report/report.md" in snakemake(tmp_path, *profile, "--config", fix, "-n").output


@pytest.mark.slow
def test_a_mixture_runs_the_dag_reports_each_source_and_a_new_weight_applies_from_the_next_segment(tmp_path):
    # A mixture's weights are a setting, not the series' identity (docs/runs.md): the completed segments stay, and
    # only a segment still to train (here a third) trains with the new weight; no data stage reruns.
    profile, mix = ("--profile", str(REPO / "profiles/local")), "overrides=experiment=smoke data=stdlib_mix"
    snakemake(tmp_path, *profile, "--config", mix)
    report = (tmp_path / "runs/default/report/report.md").read_text()
    assert "### Data mixture" in report and "| `modules` | 75.0% |" in report and "| `email` | 25.0% |" in report
    reweighted = f"{mix} data.sources.0.weight=0.5"
    assert "Nothing to be done" in snakemake(tmp_path, *profile, "--config", reweighted, "-n").output
    counts = job_counts(snakemake(tmp_path, *profile, "--config", f"{reweighted} train.segments=3", "-n").output)
    assert "prepare_data" not in counts and "prepare_data_shard" not in counts and "stage_data" not in counts
    assert counts["train_segment"] == 1
