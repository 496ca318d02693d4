"""The Snakemake workflow: lint, dry runs, config errors before any stage, and a real local run."""

from __future__ import annotations

import json

import pytest

from tests.conftest import REPO, read_json
from tests.support import job_counts, snakemake
from trainflow.status.read import read_status
from trainflow.status.show import render

# Known lints, each deliberate: rules read PYTHON/HYDRA_ARGS (see common.smk); and no rule names a conda env or
# container because none runs in one of its own: the light stages run in Snakemake's environment (the venv of
# scripts/bootstrap.sh, or the container Snakemake itself was started in), and validate_nccl and train_segment only
# submit, their ranks running in cluster.allocation.container (an EDF or an Apptainer image, srun's line:
# trainflow.launch.container), which Snakemake's software deployment cannot reach from a localrule.
ALLOWED_LINTS = {
    "Shell command directly uses variable HYDRA_ARGS from outside of the rule",
    "Shell command directly uses variable PYTHON from outside of the rule",
    "Specify a conda environment or container for each rule.",
}


def test_lint_finds_only_the_known_exceptions(tmp_path):
    result = snakemake(tmp_path, "--lint", check=False)
    lints = {line.strip()[2:].rstrip(":") for line in result.output.splitlines() if line.startswith("    * ")}
    assert lints <= ALLOWED_LINTS, lints - ALLOWED_LINTS


def test_dry_run_plans_every_stage(tmp_path):
    counts = job_counts(snakemake(tmp_path, "-n").output)
    assert counts == {
        "prepare_data": 1,
        "prepare_data_shard": 1,
        "stage_data": 1,
        "build_kernels": 1,
        "validate_nccl": 1,
        "train_segment": 3,  # the default campaign's two phases: 2 segments, then 1
        "verify_checkpoint": 1,
        "evaluate": 3,
        "account_energy": 1,
        "report": 1,
        "all": 1,
    }
    off = job_counts(snakemake(tmp_path, "-n", "--config", "overrides=evaluate.enabled=false").output)
    assert "evaluate" not in off and off == {k: v for k, v in counts.items() if k != "evaluate"}


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        ("model.n_layr=2", "unknown config key 'model.n_layr' (ModelConfig has no field 'n_layr')"),
        ("parallel.tp=3", "model.n_heads(4) is not divisible by tp(3)"),
        ("optim.lr=-1", "optim.lr(-1.0) must be > 0"),
        ("cluster.hardware.mtbf_hours=0", "cluster.hardware.mtbf_hours(0.0) must be > 0"),
        ("model=llama3_8b", "evaluate loads llama3_8b in fp32 into one process, 64 GB while its checkpoint loads"),
    ],
)
def test_bad_config_fails_before_any_stage(tmp_path, overrides, message):
    result = snakemake(
        tmp_path, "--profile", str(REPO / "profiles/local"), "--config", f"overrides={overrides}", check=False
    )
    assert result.returncode != 0
    lines = [line for line in result.output.splitlines() if message in line]
    assert len(lines) == 1, result.stderr[-2000:]
    assert not (tmp_path / "runs").exists()


def test_real_run_then_nothing_then_only_training_reruns(smoke_run):
    tmp_path, profile = smoke_run, ["--profile", str(REPO / "profiles/local")]
    run = tmp_path / "runs/default"
    report = (run / "report/report.md").read_text()
    assert "Validation loss went from" in report and "![loss](loss.png)" in report
    assert "### Planned vs measured" in report and "| `step_s_less_data` |" in report  # validate_nccl's plan
    for plot in ("loss", "throughput", "breakdown", "power", "goodput", "evaluations"):
        assert (run / f"report/{plot}.png").stat().st_size > 1000
    # The evaluate stage scored both segments' last checkpoints on the corpus task, beside training.
    evaluations = sorted(run.glob("evaluate/*/segment-*.json"))
    assert [read_json(p)["step"] for p in evaluations] == [6, 12]
    assert all(t["task"] == "corpus" and t["n"] == 16 for p in evaluations for t in read_json(p)["tasks"])
    assert "## Evaluations" in report and "![evaluations](evaluations.png)" in report
    status = render(read_status(run), bar=False)  # python -m trainflow.status runs/default
    assert "Evaluation: step 12 (" in status and "corpus acc " in status
    assert "## Goodput" in report and "![goodput](goodput.png)" in report
    # No failure injected: the plan from the run's own terms keeps what the run kept (trainflow.plan.from_run).
    assert "### Planned against measured" in report and "MTBF none (no failure)" in report
    assert "The measured goodput lies inside the plan's 5-95 % band" in report
    energy = read_json(run / "energy.json")
    assert {s["stage"] for s in energy["stages"]} >= {"prepare_data", "train_segment", "validate_nccl"}
    assert read_json(run / "verify.json")["failures"] == []
    logs = {p.relative_to(run / "logs").as_posix() for p in (run / "logs").rglob("*.log")}
    assert {"prepare_data/prepare_data.log", "report/report.log"} <= logs
    assert any(p.startswith("train_segment/") and p.endswith("/segment-1.log") for p in logs)  # <series>/segment-1

    snakemake(tmp_path, *profile, "--config", "overrides=experiment=smoke", "--report", "run.html")
    html = (tmp_path / "run.html").read_text()  # Snakemake's self-contained report of the report()-flagged outputs
    assert all(name in html for name in ("report.md", "loss.png", "throughput.png", "breakdown.png", "power.png"))

    again = snakemake(tmp_path, *profile, "--config", "overrides=experiment=smoke", "-n")
    assert "Nothing to be done" in again.output

    # A setting applies from the next segment: with none left to train, nothing reruns (docs/runs.md).
    changed = snakemake(tmp_path, *profile, "--config", "overrides=experiment=smoke optim.lr=1e-3", "-n")
    assert "Nothing to be done" in changed.output

    # Deleting one segment's output reruns that segment, which trains nothing: its kept summary comes back (and its
    # evaluation reruns: Snakemake reruns a job whose input another job of the run writes, ancient() or not).
    (segment,) = run.glob("train/*/segment-1.json")
    kept = segment.read_text()
    segment.unlink()
    redo = snakemake(tmp_path, *profile, "--config", "overrides=experiment=smoke")
    assert job_counts(redo.output) == {
        "train_segment": 1,
        "evaluate": 1,
        "verify_checkpoint": 1,
        "account_energy": 1,
        "report": 1,
        "all": 1,
    }
    assert read_json(segment) == json.loads(kept) and read_json(segment)["end_step"] == 12
    assert (
        "Segment 1 already complete at step 12: nothing to train"
        in next((run / "logs/train_segment").glob("*/segment-1.log")).read_text()
    )


@pytest.mark.parametrize(
    "config",
    [
        ["run=a", 'overrides=experiment=smoke "run=x|touch {marker}|y" optim.lr=1e-3'],  # ran touch before the fix
        ["run=..", "overrides=experiment=smoke"],
        ["overrides=experiment=smoke run=../x"],
        ["overrides=experiment=smoke storage.root=runs/../..", "site=cluster=local"],
        ["overrides=experiment=smoke", "site=+hydra.callbacks.x._target_=os.system"],
    ],
)
def test_hostile_config_fails_before_any_stage_and_writes_nothing(tmp_path, config):
    marker = tmp_path.parent / f"{tmp_path.name}-pwned"
    work = tmp_path / "work"
    work.mkdir()
    before = sorted(p.name for p in REPO.iterdir())
    result = snakemake(
        work,
        "--profile",
        str(REPO / "profiles/local"),
        "--config",
        *(c.format(marker=marker) for c in config),
        check=False,
    )
    assert result.returncode != 0
    assert not marker.exists() and sorted(p.name for p in REPO.iterdir()) == before
    assert [p.name for p in work.iterdir()] in ([], [".snakemake"])
    assert not list(work.rglob("*.log")) or all(".snakemake" in p.parts for p in work.rglob("*.log"))


def test_paths_with_spaces_run(tmp_path):
    root = tmp_path / "a run; with spaces"
    tokens = root / "fast/data/tokens/index.json"
    snakemake(
        tmp_path,
        "--profile",
        str(REPO / "profiles/local"),
        "--config",
        f"overrides=experiment=smoke \"storage.root='{root}'\"",
        "--",
        str(tokens),
    )
    assert tokens.stat().st_size > 1000 and (root / "logs/stage_data/stage_data.log").is_file()
