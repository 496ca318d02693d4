"""The whole smoke campaign on the local Slurm cluster: a failing Slurm job, then a rerun of what is left.

    bash scripts/slurm_cluster.sh start && .venv/bin/python -m pytest tests/slurm/test_workflow_on_slurm.py

profiles/slurm_local sends every light stage to Slurm through snakemake-executor-plugin-slurm;
validate_nccl and train_segment (localrules) submit their own jobs through submitit's SlurmExecutor
because the profile's site.yaml selects cluster=slurm_local. The corpus is one JSONL file whose second line is
not JSON, so the Slurm job of its shard fails at run time (a config error, or a glob that matches nothing,
would already fail while the DAG is built); fixed, the same command finishes the campaign without redoing what
had succeeded beside it (build_kernels, and validate_nccl where it got to start).
"""

from __future__ import annotations

import json
import re

import pytest

from tests.conftest import REPO, read_json
from tests.slurm.conftest import final_states
from tests.support import job_counts, snakemake
from trainflow.config import ALLOCATING, STAGES

pytestmark = pytest.mark.slurm

PROFILE = ("--profile", str(REPO / "profiles/slurm_local"))
LIGHT = {*(set(STAGES) - set(ALLOCATING)), "prepare_data_shard"}  # the stages sent to Slurm by the plugin
PLUGIN_JOB = re.compile(r"Job \d+ has been submitted with SLURM jobid (\d+) \(log: \S+/rule_(\w+)/")
SUBMITIT_JOB = re.compile(r"Waiting for slurm job (\d+)")
FINISHED = re.compile(r"Finished jobid: \d+ \(Rule: (\w+)\)")
DAG = {
    "prepare_data_shard": 1,
    "prepare_data": 1,
    "stage_data": 1,
    "train_segment": 2,
    "evaluate": 1,
    "verify_checkpoint": 1,
    "account_energy": 1,
    "report": 1,
    "all": 1,
}
"""The smoke campaign's jobs after the gate's and the kernels' (which the failed run may have finished)."""


def finished(output: str) -> set[str]:
    """The rules a Snakemake run finished."""
    return set(FINISHED.findall(output))


@pytest.fixture(scope="module")
def campaign(tmp_path_factory):
    workdir = tmp_path_factory.mktemp("campaign")
    docs = workdir / "corpus/docs.jsonl"
    docs.parent.mkdir()
    docs.write_text('{"text": "a first document"}\nnot json\n')
    # cluster=slurm_local: the site.yaml; evaluate.every=2: the last segment's evaluation only (a Slurm job fewer)
    config = ("--config", f"overrides=experiment=smoke data.corpus={docs} evaluate.every=2")
    failed = snakemake(workdir, *PROFILE, *config, check=False)
    texts = sorted((REPO / "tests/assets/corpus").glob("*.txt"))
    docs.write_text("".join(json.dumps({"text": text.read_text()}) + "\n" for text in texts))
    rerun = snakemake(workdir, *PROFILE, *config)
    return workdir / "runs/default", failed, rerun


def test_failed_slurm_job_fails_its_rule_with_the_stage_error(campaign):
    run, failed, _ = campaign
    assert failed.returncode != 0
    ((job, rule),) = [m for m in PLUGIN_JOB.findall(failed.output) if m[1] == "prepare_data_shard"]
    assert f"SLURM-job '{job}' failed" in failed.output, failed.output[-3000:]
    assert "Error in rule prepare_data_shard" in failed.output
    # show-failed-logs prints the stage's own one-line error: the file and line, and the fix.
    assert re.search(r"DataError: \S+/corpus/docs\.jsonl:2 is not JSON \(.* set data\.bad_lines=skip", failed.output)
    assert final_states([job]) == {job: "FAILED"}


def test_rerun_completes_only_what_is_left(campaign):
    _, failed, rerun = campaign
    # What finished beside the failed prepare_data_shard (build_kernels, and validate_nccl where it got to start
    # before the failure stopped the scheduling) is not redone; the rest of the DAG runs once.
    done = finished(failed.output)
    assert "build_kernels" in done and not done & {"prepare_data_shard", "prepare_data", "train_segment"}, done
    dag = {**DAG, "validate_nccl": 1, "build_kernels": 1}
    assert job_counts(rerun.output) == {rule: n for rule, n in dag.items() if rule not in done}


def test_every_stage_ran_as_a_slurm_job(campaign):
    run, failed, rerun = campaign
    light = {rule: job for job, rule in PLUGIN_JOB.findall(rerun.output)}
    assert set(light) | {rule for _, rule in PLUGIN_JOB.findall(failed.output)} == LIGHT  # build_kernels: the first
    submitit = {}
    segment_logs = sorted((run / "logs/train_segment").glob("*/segment-*.log"))  # logs/train_segment/<series>/
    for log in [run / "logs/validate_nccl/validate_nccl.log", *segment_logs]:
        (submitit[log],) = SUBMITIT_JOB.findall(log.read_text())
    jobs = [*light.values(), *submitit.values()]
    assert len(set(jobs)) == len(jobs) == len(light) + 3
    assert set(final_states(jobs).values()) == {"COMPLETED"}
    for job in submitit.values():
        script = next(run.glob(f"submitit/*/{job}_submission.sh")).read_text()
        assert "#SBATCH --partition=debug" in script and "#SBATCH --signal=USR2@30" in script

    report = (run / "report/report.md").read_text()
    assert "Validation loss went from" in report
    segments = [read_json(p) for p in sorted(run.glob("train/*/segment-*.json"))]
    ranges = [(s["start_step"], s["end_step"], s["setup"]["layout"]["world_size"]) for s in segments]
    assert ranges == [(0, 6, 2), (6, 12, 2)]
    assert read_json(run / "verify.json")["failures"] == []
