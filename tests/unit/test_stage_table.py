"""The stage table (trainflow.config.stages) against what the repository holds for each stage: its rule file and the
rules in it, its module and the config its @hydra.main composes, its primary config, and the Snakefile's localrules."""

from __future__ import annotations

import dataclasses
import re

import pytest
import yaml

from tests.conftest import REPO
from trainflow.config import ALLOCATING, CONF_DIR, STAGES, compose
from trainflow.config.hashing import stage_hash
from trainflow.config.resilience import ResilienceConfig


def test_every_stage_has_a_rule_file_a_module_and_a_primary_config_and_nothing_else_does():
    rules = {p.stem for p in (REPO / "workflow/rules").glob("*.smk")} - {"common"}
    modules = {p.stem for p in (REPO / "src/trainflow/stages").glob("*.py")} - {"__init__"}
    primaries = {p.stem for p in CONF_DIR.glob("*.yaml")} - {"trainflow"}
    assert rules == modules == primaries == set(STAGES)


@pytest.mark.parametrize("stage", STAGES)
def test_each_stage_is_named_alike_everywhere(stage):
    smk = (REPO / f"workflow/rules/{stage}.smk").read_text()
    assert re.search(rf"^rule {stage}:", smk, re.M), f"workflow/rules/{stage}.smk has no rule {stage}"
    rules = re.findall(r"^rule (\w+):", smk, re.M)
    # Every rule of the file (prepare_data's tokenizer and shard jobs too) hashes what the stage reads, runs the
    # stage's module and logs under the stage's folder.
    assert re.findall(r'config_hash=(?:lambda w: )?rule_hash\("(\w+)"', smk) == [stage] * len(rules)
    assert re.findall(r"-m trainflow\.stages\.(\w+)", smk) == [stage] * len(rules)
    assert re.findall(r'RUN\.log\("(\w+)"', smk) == [stage] * len(rules)
    module = (REPO / f"src/trainflow/stages/{stage}.py").read_text()
    assert f'config_name="{stage}"' in module and f"python -m trainflow.stages.{stage}" in module
    assert yaml.safe_load((CONF_DIR / f"{stage}.yaml").read_text())["stage"] == stage


def test_localrules_are_the_stages_that_submit_their_own_allocation():
    block = re.search(r"^localrules:\n((?:[ \t]+\w+,?\n)+)", (REPO / "Snakefile").read_text(), re.M)
    assert block, "the Snakefile has no localrules: block"
    assert set(re.findall(r"\w+", block[1])) == {"all", *ALLOCATING}
    for stage in ALLOCATING:  # they run where Snakemake runs: no Slurm resources of their own
        assert "resources:" not in (REPO / f"workflow/rules/{stage}.smk").read_text()


def test_a_training_segment_is_named_by_its_series_never_by_how_it_runs():
    base = stage_hash(compose("train_segment", []), "train_segment")
    values = {
        "resilience.max_restarts": "0",
        "resilience.max_excluded_nodes": "2",
        "resilience.health_check_after_s": "60",
        "resilience.max_pending_s": "60",
        "resilience.exclude_stragglers": "true",
        "resilience.max_rollbacks": "0",
        "resilience.recovery": "peers",
        "resilience.failure_detect_s": "5",
        "resilience.hang_detect_s": "15",
        "resilience.start_s": "60",
        "resilience.heartbeat_s": "1",
        "resilience.straggler_factor": "2",
    }
    assert set(values) == {f"resilience.{f.name}" for f in dataclasses.fields(ResilienceConfig)}
    needs = {"resilience.recovery": ["cluster.allocation.spare_nodes=1", "parallel=dp2"]}  # what peers requires
    for path, value in values.items():
        extra = needs.get(path, [])
        assert stage_hash(compose("train_segment", [*extra, f"{path}={value}"]), "train_segment") == base, path
    settings = ["cluster.allocation.spare_nodes=2", "cluster.runtime.collective_timeout_s=7", "optim.lr=1e-4"]
    settings += ["parallel=tp2", "train.segments=9", "checkpoint.interval_steps=9", "cluster.hardware.mtbf_hours=2"]
    settings += [
        "resilience.recovery=peers parallel=tp2 cluster.allocation.nodes=2 cluster.allocation.spare_nodes=1 "
        "checkpoint.snapshot_steps=2"
    ]
    for setting in settings:  # how the next steps run: applied from the next segment, never a rerun
        assert stage_hash(compose("train_segment", setting.split()), "train_segment") == base, setting
    for identity in ("model.dim=256", "data.tokenizer=bpe", "train.branch_from=12", "model.rope_scaling=llama3"):
        assert stage_hash(compose("train_segment", [identity]), "train_segment") != base, identity
