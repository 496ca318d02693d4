"""A campaign in phases as one DAG (docs/phases.md): both phases train once, a rerun does nothing, and editing the
second phase's learning rate retrains that phase alone."""

from __future__ import annotations

import json

import pytest

from tests.conftest import REPO
from tests.support import snakemake

PROFILE = ("--profile", str(REPO / "profiles/local"))
LONG = [
    "model.seq_len=256",
    "model.rope_scaling=llama3",
    "model.rope_factor=2",
    "model.rope_original_seq_len=128",
    "parallel=tp2",
    "optim.schedule=wsd",
    "optim.decay_steps=6",
    "train.segments=1",
]


def jobs(output: str) -> dict[str, int]:
    """A dry run's job counts by rule (its 'Job stats' table)."""
    table = output.split("Job stats:")[1].split("total")[0]
    return {row.split()[0]: int(row.split()[1]) for row in table.splitlines()[3:] if row.strip()}


@pytest.mark.slow  # 75 s: the smoke DAG in two phases
def test_a_campaign_in_phases_runs_once_and_an_edited_phase_retrains_alone(tmp_path):
    snakemake(tmp_path, *PROFILE, "--config", "overrides=experiment=smoke_phases")
    train = tmp_path / "runs/default/train"
    first, second = sorted(p.name for p in train.iterdir())
    assert second.startswith(f"{first}-long_context-")
    assert [json.loads((train / s / "segment-0.json").read_text())["start_step"] for s in (first, second)] == [0, 12]
    assert (
        "Nothing to be done"
        in snakemake(tmp_path, *PROFILE, "--config", "overrides=experiment=smoke_phases", "-n").output
    )

    edited = json.dumps([*LONG, "optim.lr=1e-3"]).replace(" ", "")
    dry = snakemake(
        tmp_path, *PROFILE, "--config", f"overrides=experiment=smoke_phases 'phases.1.overrides={edited}'", "-n"
    )
    assert jobs(dry.output)["train_segment"] == 1  # phase 2 afresh from phase 1's end; phase 1 untouched
    assert (
        f"runs/default/train/{first}/"
        not in dry.output.split("rule train_segment:")[1].split("output:")[1].split("\n")[0]
    )
