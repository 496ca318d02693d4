"""Shapes no machine holds (issue 43, case 4), each refused in one line before anything runs, with a fix that works
when followed: a segment count past train.segments' bound (composing a billion ran out of memory, one path per
segment), and a local world past this machine's cores or memory (128 ranks on 2 cores were planned to fit)."""

from __future__ import annotations

import math
import os
import re
import time

import pytest

from trainflow import preflight as machine
from trainflow.config import ConfigError, compose
from trainflow.config.schema import MAX_SEGMENTS
from trainflow.plan.__main__ import main as plan_main


def test_a_billion_segments_is_refused_at_compose_in_one_line_and_the_plan_says_so(capsys):
    started = time.monotonic()
    with pytest.raises(ConfigError) as err:
        compose("train_segment", ["train.segments=1000000000"])
    assert time.monotonic() - started < 5
    assert str(err.value) == (
        f"invalid config: train.segments(1000000000) must be <= {MAX_SEGMENTS} (each is a DAG node and a job: make "
        "train.segment_steps longer)"
    )
    assert plan_main(["train.segments=1000000000"]) == 1
    assert capsys.readouterr().err.splitlines() == [f"trainflow.plan: {err.value}"]


def test_the_most_segments_compose_without_a_path_per_segment_where_none_is_read():
    """The fix followed: as many segments as the bound, longer each. Only the stages that read every segment's files
    list them (account_energy, report); train_segment's config, which plans the DAG, lists none."""
    started = time.monotonic()
    cfg = compose("train_segment", [f"train.segments={MAX_SEGMENTS}", "train.segment_steps=1000"])
    assert cfg.io.segment_reports == [] and cfg.io.run_metrics == []
    report = compose("report", [f"train.segments={MAX_SEGMENTS}"])
    assert len(report.io.segment_reports) == MAX_SEGMENTS and report.io.segment_reports[-1].endswith("-4095.json")
    assert time.monotonic() - started < 5


def too_many_ranks() -> int:
    """A power-of-two data-parallel degree past what this machine's cores run."""
    return 2 ** math.ceil(math.log2(machine.RANKS_PER_CORE * len(os.sched_getaffinity(0)) + 1))


def test_a_local_world_past_the_cores_is_refused_and_the_fix_it_names_runs(capsys, monkeypatch):
    monkeypatch.setattr(machine, "available_memory_gb", lambda: 22.4)  # the line names it: the same in both calls
    dp = too_many_ranks()
    given = [f"parallel.dp={dp}", f"train.global_batch={dp}", "phase=pretrain"]  # one phase: a plain plan
    with pytest.raises(ConfigError) as err:
        machine.preflight(compose("train_segment", given))
    line = str(err.value)
    assert line.startswith(f"config cannot run here: the local world of {dp} ranks (dp({dp}) * cp(1) * tp(1) * pp(1))")
    assert f"run at most {machine.RANKS_PER_CORE * len(os.sched_getaffinity(0))} (" in line and "\n" not in line
    assert plan_main(given) == 1  # the plan counted tensors only, and said it fits
    assert capsys.readouterr().err.splitlines() == [f"trainflow.plan: {line.removeprefix('config cannot run here: ')}"]
    key, value = re.search(r"lower (parallel\.\w+) to (\d+)", line).groups()
    machine.preflight(compose("train_segment", [*given, f"{key}={value}"]))


def test_a_local_world_past_the_available_memory_is_refused(monkeypatch):
    """What a rank's process costs (RANK_PROCESS_GB, measured), against a machine with 1 GB available."""
    monkeypatch.setattr(machine, "available_memory_gb", lambda: 1.0)
    with pytest.raises(ConfigError) as err:
        machine.preflight(compose("train_segment", ["parallel=dp2_tp2"]))
    assert "its 1.0 GB available memory 3 (0.3 GB a rank's process); lower parallel.dp to 1" in str(err.value)
    machine.preflight(compose("train_segment", ["parallel=dp2_tp2", "parallel.dp=1"]))
    machine.preflight(compose("train_segment", ["parallel=dp2_tp2", "cluster=slurm_local"]))  # not this machine's
