"""Faults during training: a dead rank, a pre-timeout signal, a corrupt shard, a crash mid-checkpoint.

Each drill runs 2 segments x 6 steps on 2 ranks (dp2, gloo, deterministic) through the real
launcher, with checkpoints every 2 steps, and must end bit for bit where an uninterrupted run ends:
same per-rank SHA-256 of model and optimizer state, same losses. The pre-timeout, corrupt-checkpoint and
crash-mid-commit drills run in both checkpoint modes (async: slow), against the same sync reference: the mode changes
when bytes reach the disk, never a number. The dead-rank drill is sync's alone: async's (test_async_checkpoints.py)
may leave another checkpoint the newest.
"""

from __future__ import annotations

import random
import re
import socket
from pathlib import Path

import pytest

from tests.conftest import make_config, run_segment, step_losses
from trainflow.checkpoint.folders import list_steps, step_dir
from trainflow.checkpoint.manifest import verify
from trainflow.launch import LaunchError

BASE = (
    "parallel=dp2",
    "train.segments=2",
    "train.segment_steps=6",
    "checkpoint.interval_steps=2",
    "cluster.runtime.collective_timeout_s=10",
)
MODES = ["sync", pytest.param("async", marks=pytest.mark.slow)]
"""checkpoint.mode of the drills that run in both."""
NO_RESTART = "resilience.max_restarts=0"
"""The drills of a failure a person reruns after (test_restarts.py has the stage restart its own job)."""


def segment(root: Path, tokens: Path, index: int, *fault: str, mode: str = "sync") -> dict:
    return run_segment(root, tokens, *BASE, f"checkpoint.mode={mode}", f"segment={index}", *fault)


def checkpoints(root: Path, mode: str = "sync") -> Path:
    return Path(make_config("train_segment", root, *BASE, f"checkpoint.mode={mode}").io.checkpoints)


def log_files(root: Path, mode: str = "sync") -> set[Path]:
    return set(Path(make_config("train_segment", root, *BASE, f"checkpoint.mode={mode}").io.submitit).glob("*_log.*"))


def job_logs(root: Path, *, besides: set[Path] = frozenset(), mode: str = "sync") -> str:
    """The text of the jobs' logs, except those in `besides`."""
    return "".join(p.read_text(errors="replace") for p in sorted(log_files(root, mode) - besides))


@pytest.fixture(scope="module")
def reference(tmp_path_factory, tokens) -> tuple[dict, dict]:
    root = tmp_path_factory.mktemp("reference")
    return segment(root, tokens, 0), segment(root, tokens, 1)


def assert_same_end(segments: tuple[dict, dict], reference: tuple[dict, dict]) -> None:
    assert segments[1]["state_digest"] == reference[1]["state_digest"]
    assert step_losses(*segments) == step_losses(*reference)


@pytest.mark.slow  # 19 s; test_restarts' dead rank, restarted and bitwise, stays in the default suite
def test_dead_rank_fails_the_segment_naming_it_and_the_rerun_resumes_bitwise(tmp_path, tokens, reference):
    first = segment(tmp_path, tokens, 0)
    step = random.Random().randint(7, 11)
    with pytest.raises(LaunchError) as err:
        segment(tmp_path, tokens, 1, f"fault.step={step}", "fault.rank=1", "fault.signal=KILL", NO_RESTART)
    # One line: the dead rank, its host and signal, the job and the dead rank's log, and where a rerun resumes:
    # the newest checkpoint, every 2 steps, before the step rank 1 died at.
    saved = step - step % 2
    root = checkpoints(tmp_path)
    assert list_steps(root)[-1] == saved
    line = str(err.value)
    assert "\n" not in line
    assert re.fullmatch(
        rf"segment 1 failed: rank 1 on host {re.escape(socket.gethostname())} was killed by SIGKILL "
        rf"\(local job (\d+), full log: .*/\1_1_log\.err\); "
        r"not restarted: resilience\.max_restarts\(0\) used up \(that many restarts in a row saved no newer "
        r"checkpoint\); "
        rf"rerunning the workflow resumes it from step {saved} \(newest checkpoint in {re.escape(str(root))}\)",
        line,
    ), line
    failed = log_files(tmp_path)
    resumed = segment(tmp_path, tokens, 1)
    assert f"Resumed from the checkpoint of step {saved} in" in job_logs(tmp_path, besides=failed)
    assert_same_end((first, resumed), reference)


@pytest.mark.parametrize("mode", MODES)
def test_pre_timeout_signal_checkpoints_requeues_and_resumes_bitwise(tmp_path, tokens, reference, mode):
    rng = random.Random()
    step, rank = rng.randint(1, 4), rng.randint(0, 1)
    first = segment(tmp_path, tokens, 0, f"fault.step={step}", f"fault.rank={rank}", "fault.signal=USR2", mode=mode)
    logs = job_logs(tmp_path, mode=mode)
    assert "Requeued job" in logs and f"Saved checkpoint step {step + 1}" in logs
    assert f"Resumed from the checkpoint of step {step + 1}" in logs
    # Every rank's shards of the signal-time checkpoint were written and verify.
    saved = step_dir(checkpoints(tmp_path, mode), step + 1)
    if saved.exists():  # odd steps: later pruned only if newer ones exist; keep=3 keeps it here
        assert {p.name.split("_")[2] for p in saved.glob("__*.distcp")} == {"0", "1"}
        assert len(verify(saved).files) >= 3
    assert_same_end((first, segment(tmp_path, tokens, 1, mode=mode)), reference)


@pytest.mark.parametrize("mode", MODES)
def test_corrupt_newest_checkpoint_is_detected_and_the_previous_one_used(tmp_path, tokens, reference, mode):
    first = segment(tmp_path, tokens, 0, mode=mode)
    root = checkpoints(tmp_path, mode)
    assert list_steps(root) == [2, 4, 6]
    rng = random.Random()
    shard = rng.choice(sorted(step_dir(root, 6).glob("__*_0.distcp")))
    data = bytearray(shard.read_bytes())
    data[rng.randrange(len(data))] ^= 0xFF
    shard.write_bytes(bytes(data))
    second = segment(tmp_path, tokens, 1, mode=mode)
    logs = job_logs(tmp_path, mode=mode)
    assert f"Skipped checkpoint step 6: {shard}" in logs
    assert "Resumed from the checkpoint of step 4" in logs
    assert_same_end((first, second), reference)


@pytest.mark.parametrize("mode", MODES)
def test_crash_while_writing_a_checkpoint_leaves_the_previous_one_intact(tmp_path, tokens, reference, mode):
    with pytest.raises(LaunchError):
        segment(tmp_path, tokens, 0, "fault.step=4", "fault.rank=1", "fault.during_save=true", NO_RESTART, mode=mode)
    root = checkpoints(tmp_path, mode)
    assert (root / "step-00000004.tmp").is_dir() and list_steps(root) == [2]
    assert len(verify(step_dir(root, 2)).files) >= 3  # .metadata + each rank's shards
    first = segment(tmp_path, tokens, 0, mode=mode)
    assert "Resumed from the checkpoint of step 2" in job_logs(tmp_path, mode=mode)
    assert not (root / "step-00000004.tmp").exists()
    assert_same_end((first, segment(tmp_path, tokens, 1, mode=mode)), reference)
