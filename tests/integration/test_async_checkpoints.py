"""checkpoint.mode=async through the real launcher (2 ranks, dp2, gloo, deterministic): a resumed run ends bit for bit
where an uninterrupted one does, and a rank SIGKILLed while its save is written in the background leaves the previous
checkpoint the newest valid one, which the rerun resumes from bitwise.

Slow (`-m slow`): the death one boundary later; a writer process SIGKILLed during a background write; a full disk
during one. test_fault_tolerance.py runs its pre-timeout, corrupt-checkpoint and crash-mid-commit drills in async
mode too.
"""

from __future__ import annotations

import os
import re
import subprocess
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from tests.conftest import assert_resumes_bitwise, make_config, mounted_tmpfs, run_segment, step_losses
from trainflow.checkpoint.folders import list_steps, step_dir
from trainflow.checkpoint.manifest import verify
from trainflow.launch import LaunchError

ASYNC = "checkpoint.mode=async"
RUN = (
    "parallel=dp2",
    "train.segments=1",
    "train.segment_steps=6",
    "checkpoint.interval_steps=2",
    "cluster.runtime.collective_timeout_s=10",
    ASYNC,
)
RESUMED = re.compile(r"(?:Resumed from|Loaded) the checkpoint of step (\d+) in")
"""The trainer's line for the checkpoint a job started from."""


def logs(root: Path) -> str:
    folder = Path(make_config("train_segment", root, *RUN).io.submitit)
    return "".join(p.read_text(errors="replace") for p in sorted(folder.glob("*_log.*")))


def run_through(root: Path, tokens: Path, *fault: str, before_rerun=lambda: None) -> tuple[str, dict]:
    """Run with the fault and, where the failure ended the stage, check `before_rerun` and rerun without it; the
    failure's line (from the stage, or from the job's log where the stage restarted the job itself) and the summary
    of the run that finished."""
    try:
        finished = run_segment(root, tokens, *RUN, *fault)
    except LaunchError as err:
        before_rerun()
        return str(err), run_segment(root, tokens, *RUN)
    return next(iter(re.findall(r"(?:Error|Killed): (.*)", logs(root))), ""), finished


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory, tokens) -> dict:
    return run_segment(tmp_path_factory.mktemp("uninterrupted"), tokens, *RUN)


def assert_bitwise(finished: dict, uninterrupted: dict) -> None:
    assert finished["state_digest"] == uninterrupted["state_digest"]
    assert step_losses(finished) == step_losses(uninterrupted)


def test_async_resume_is_bitwise(tmp_path, tokens):
    assert_resumes_bitwise(tmp_path, tokens, "parallel=dp2", ASYNC)


@pytest.mark.parametrize("kill_at", [4, pytest.param(5, marks=pytest.mark.slow)])
def test_rank_killed_during_a_background_write_leaves_the_previous_checkpoint(tmp_path, tokens, uninterrupted, kill_at):
    # Step 4's save is handed to the writer processes at the boundary before step 4 starts. Rank 1 dies at the start
    # of step 4 (its writer with it, PR_SET_PDEATHSIG): no rank 0 publishes it, and step 2 (durable, since the save
    # of step 4 waited for it) is what the rerun resumes from. Or rank 1 dies at the start of step 5, one boundary
    # later: where every rank's write had finished by that boundary, the ranks agreed on it there and rank 0's commit
    # thread may publish a complete step 4 before the launcher kills rank 0; else step 2 again. Either way the newest
    # valid checkpoint is a whole one and the rerun is bitwise. In sync mode the same deaths leave step 4
    # (test_fault_tolerance.py).
    root = Path(make_config("train_segment", tmp_path, *RUN).io.checkpoints)
    may_resume_from = {4: [2], 5: [2, 4]}[kill_at]

    def newest_is_a_whole_one() -> None:
        assert list_steps(root)[-1] in may_resume_from and not (step_dir(root, 4, "tmp") / "manifest.json").exists()

    _, finished = run_through(
        tmp_path,
        tokens,
        f"fault.step={kill_at}",
        "fault.rank=1",
        "fault.signal=KILL",
        before_rerun=newest_is_a_whole_one,
    )
    (resumed,) = [int(s) for s in RESUMED.findall(logs(tmp_path))]
    assert resumed in may_resume_from
    assert len(verify(step_dir(root, 6)).files) >= 3
    assert_bitwise(finished, uninterrupted)


def writer_of(rank: int) -> int | None:
    """The pid of this test's writer process of `rank`: a spawned descendant of this process whose environment says
    RANK=<rank> (torch.distributed's, exported by the task before the writer starts)."""
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            cmdline = (entry / "cmdline").read_bytes()
            environ = (entry / "environ").read_bytes().split(b"\0")
        except OSError:
            continue
        if b"spawn_main" not in cmdline or f"RANK={rank}".encode() not in environ:
            continue
        pid = int(entry.name)
        while pid > 1:
            try:
                pid = int((Path("/proc") / str(pid) / "stat").read_text().rsplit(")", 1)[1].split()[1])
            except OSError:
                break
            if pid == os.getpid():
                return int(entry.name)
    return None


def kill_writer_when_saving(root: Path, step: int, rank: int) -> str:
    """SIGKILL `rank`'s writer process as soon as the save of `step` begins (its folder appears)."""
    deadline = time.monotonic() + 600
    while not step_dir(root, step, "tmp").exists() and time.monotonic() < deadline:
        time.sleep(0.001)
    pid = writer_of(rank)
    assert pid is not None, f"no writer process of rank {rank} while step {step} was saved"
    os.kill(pid, 9)
    return f"its writer process (pid {pid}) was killed by SIGKILL"


@pytest.mark.slow
def test_writer_killed_during_a_background_write_fails_in_one_line_and_the_rerun_resumes_bitwise(
    tmp_path, tokens, uninterrupted
):
    root = Path(make_config("train_segment", tmp_path, *RUN).io.checkpoints)
    # The kill lands during the write of step 4, or (rarely, on a loaded machine) just after it answered: then the
    # save of step 6 is the one that finds its writer dead. Either way the previous checkpoint is the newest.
    failed = []

    def newest_is_the_previous() -> None:
        assert list_steps(root)[-1] == failed[0] - 2 and not step_dir(root, failed[0], "tmp").exists()

    with ThreadPoolExecutor(1) as killer:
        killed = killer.submit(kill_writer_when_saving, root, 4, 1)
        try:
            line, finished = "", run_segment(tmp_path, tokens, *RUN)  # the stage restarted the job itself
        except LaunchError as err:
            line, finished = str(err), None
        text = killed.result()
    line = line or " ".join(re.findall(r"CheckpointWriteError: (.*)", logs(tmp_path))[:1])
    failed.append(int(re.search(r"writing step (\d+) to", line)[1]))
    assert text in line and "failed on rank 1 (" in line and "the previous checkpoints are intact" in line, line
    assert failed[0] in (4, 6)
    if finished is None:
        newest_is_the_previous()
        finished = run_segment(tmp_path, tokens, *RUN)
    assert [int(s) for s in RESUMED.findall(logs(tmp_path))] == [failed[0] - 2]
    assert_bitwise(finished, uninterrupted)


@pytest.fixture
def small_tmpfs(tmp_path):
    """A real 15 MB file system: room for one dp2 smoke checkpoint (10.3 MB) and its step logs, not for two."""
    with mounted_tmpfs(tmp_path / "tmpfs", "15m") as mount:
        yield mount


@pytest.mark.slow
def test_a_full_disk_during_a_background_write_fails_in_one_line_and_the_rerun_resumes_bitwise(
    tmp_path, tokens, uninterrupted, small_tmpfs
):
    ckpt = f"io.checkpoints={small_tmpfs}/checkpoints"
    with pytest.raises(LaunchError) as err:
        run_segment(tmp_path, tokens, *RUN, ckpt)
    line = str(err.value)
    assert f"no space left on {small_tmpfs}/checkpoints writing step 4 ({small_tmpfs}/checkpoints/step-" in line, line
    assert list_steps(small_tmpfs / "checkpoints") == [2]
    # What it says the save needs is the checkpoint's size (step 2's), within its .metadata: dp2's replicated state
    # counts once, as DCP writes it (the estimate from every rank's state said twice as much)
    needs = float(re.search(r"needs ~([\d.e-]+) GB", line)[1]) * 1e9
    assert needs == pytest.approx(verify(step_dir(small_tmpfs / "checkpoints", 2)).nbytes, rel=0.05), line
    subprocess.run(["mount", "-o", "remount,size=48m", str(small_tmpfs)], check=True)  # the line's fix: free space
    finished = run_segment(tmp_path, tokens, *RUN, ckpt)
    assert_bitwise(finished, uninterrupted)
