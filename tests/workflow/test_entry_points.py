"""Every command a user types a config into refuses a mistyped key in trainflow's one line with the closest key, exit
status non-zero: each stage run alone (`python -m trainflow.stages.<stage>`, which fails at composition, before
train_segment's imports load torch), `python -m trainflow.plan`, `python -m trainflow.export` and the workflow
(`snakemake -n --config overrides=...`). @hydra.main printed Hydra's 7-line message for `checkpoint.mde=x`, whose
`+checkpoint.mde=x` then started a training job; `+optim.lrr=1e-3` ran everywhere with optim.lr's default."""

from __future__ import annotations

import subprocess
import sys

from tests.conftest import read_json
from tests.support import SNAKEMAKE
from trainflow.config import STAGES
from trainflow.energy.metrics import JobMetrics

MISTYPED = {
    "+optim.lrr=1e-3": "unknown config key 'optim.lrr' (OptimConfig has no field 'lrr'): did you mean 'optim.lr'?",
    "checkpoint.mde=x": (
        "unknown config key 'checkpoint.mde' (CheckpointConfig has no field 'mde'): did you mean 'checkpoint.mode'?"
    ),
}
# What Snakemake itself prints around a WorkflowError raised while it reads the Snakefile (common.smk's line is
# the one between them).
SNAKEMAKE_FRAME = ("Using ", "Config file ", "WorkflowError in file ", '  File "')


def commands(tmp_path, override: str) -> dict[str, list[str]]:
    python = [sys.executable, "-m"]
    return {
        **{stage: [*python, f"trainflow.stages.{stage}", override] for stage in STAGES},
        "plan": [*python, "trainflow.plan", override],
        "export": [*python, "trainflow.export", str(tmp_path / "no-checkpoint"), str(tmp_path / "hf"), override],
        "workflow": [*SNAKEMAKE, "--directory", str(tmp_path), "-n", "--config", f"overrides={override}"],
    }


def test_every_entry_point_refuses_a_mistyped_key_in_one_line(tmp_path):
    # All at once: the exports wait for torch (~4 s of CPU each), the others a second or two.
    runs = {
        (name, override): subprocess.Popen(
            argv, cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
        )
        for override in MISTYPED
        for name, argv in commands(tmp_path, override).items()
    }
    for (name, override), proc in runs.items():
        output, _ = proc.communicate(timeout=300)
        lines = output.splitlines()
        if name == "workflow":
            lines = [line for line in lines if not line.startswith(SNAKEMAKE_FRAME)]
        assert proc.returncode != 0, (name, override, output)
        assert len(lines) == 1 and lines[0].endswith(MISTYPED[override]), (name, override, output)
    assert not list(tmp_path.iterdir())  # nothing ran: no runs/, no hf/, not even .snakemake/


def test_a_stage_run_alone_runs_with_its_overrides_and_says_how(tmp_path):
    stage = [sys.executable, "-m", "trainflow.stages.prepare_data"]
    help_text = subprocess.run([*stage, "--help"], capture_output=True, text=True)
    assert help_text.returncode == 0 and "usage: python -m trainflow.stages.prepare_data" in help_text.stdout
    subprocess.run([*stage, "experiment=smoke", "run=alone"], cwd=tmp_path, capture_output=True, check=True)
    metrics = JobMetrics.from_json(read_json(tmp_path / "runs/alone/metrics/prepare_data.json"))
    assert metrics.stage == "prepare_data" and metrics.config["run"] == "alone"
