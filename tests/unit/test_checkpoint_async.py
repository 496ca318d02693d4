"""checkpoint.mode=async on a 1-rank group: the checkpoint holds the state of the step it was taken at although
training went on, it becomes durable only through the boundaries' agreement, its plan is made once, and a full
disk or a killed writer process fails in one line, leaving the previous checkpoint to load bit for bit."""

from __future__ import annotations

import os
import signal
import time

import pytest
import torch
from torch.distributed.checkpoint.default_planner import DefaultSavePlanner

from tests.support import blank_like, flat
from trainflow.checkpoint.manager import CheckpointManager, CheckpointWriteError, list_steps, step_dir
from trainflow.checkpoint.manifest import verify
from trainflow.checkpoint.staging import StagingError
from trainflow.checkpoint.state import build_state, state_bytes

pytestmark = pytest.mark.usefixtures("one_rank_group")


def trained(width: int) -> tuple[torch.nn.Module, torch.optim.Optimizer]:
    """A linear layer after one AdamW step (so the optimizer holds moments)."""
    torch.manual_seed(0)
    model = torch.nn.Linear(width, width)
    opt = torch.optim.AdamW(model.parameters(), lr=0.1)
    step(model, opt)
    return model, opt


def step(model: torch.nn.Module, opt: torch.optim.Optimizer) -> None:
    model(torch.randn(2, model.in_features)).square().sum().backward()
    opt.step()
    opt.zero_grad(set_to_none=True)


def snapshot(state: dict) -> dict:
    return {k: v.clone() for k, v in flat(state).items()}


def durable(manager: CheckpointManager, *, within_s: float = 120) -> list:
    """Poll boundary after boundary (a short step's worth of sleep in between) until a save is durable; the first
    waits for the writer process to start (it imports torch)."""
    deadline = time.monotonic() + within_s
    while time.monotonic() < deadline:
        if done := manager.poll():
            return done
        time.sleep(0.02)
    raise AssertionError(f"no save became durable in {within_s} s")


def assert_loads(manager: CheckpointManager, step_: int, want: dict) -> None:
    loaded = blank_like(want)
    manager.load(step_, loaded)
    for key, value in flat(want).items():
        assert torch.equal(flat(loaded)[key], value), key


def test_async_save_holds_its_step_and_turns_durable_at_a_boundary(tmp_path, monkeypatch):
    plans = []
    plan = DefaultSavePlanner.create_global_plan
    monkeypatch.setattr(DefaultSavePlanner, "create_global_plan", lambda self, p: plans.append(1) or plan(self, p))
    model, opt = trained(256)
    manager = CheckpointManager(tmp_path, keep=2, pinned=set(), mode="async", staging_bytes=state_bytes([model]))
    for n in (1, 2):
        state = build_state([model], [opt], step=n)
        want = snapshot(state)
        assert manager.save(n, state, optimizers=[opt], step_s=0.1) == []
        step(model, opt)  # training goes on: this step waits for the background copy, then changes every tensor
        assert not step_dir(tmp_path, n).exists()  # nothing is published before the boundaries agree
        (done,) = durable(manager)
        assert (done.step, done.step_s, done.overlap_steps >= 2) == (n, 0.1, True)
        assert done.background_s > 0 and done.blocking_s > 0
        assert len(verify(step_dir(tmp_path, n)).files) == 3  # .metadata + two shard files, every CRC re-read
        assert_loads(manager, n, want)
    assert plans == [1]  # planned once, the plan kept for the second save
    state = build_state([model], [opt], step=3)
    manager.save(3, state, optimizers=[opt])
    (done,) = manager.finish()  # the segment's end: waits, and says how long
    manager.wait()  # the prune the commit queued behind it
    assert done.step == 3 and done.waited_s > 0 and list_steps(tmp_path) == [2, 3]
    manager.close()


def test_a_full_disk_during_the_background_write_fails_in_one_line(tiny_tmpfs):  # noqa: F811
    model, opt = trained(16)
    manager = CheckpointManager(tiny_tmpfs, keep=2, pinned=set(), mode="async")
    small = build_state([model], [opt], step=1)
    want = snapshot(small)
    manager.save(1, small, optimizers=[opt])
    manager.finish()
    big = {"model": {"w": torch.randn(256, 512)}, "step": torch.tensor(2)}  # 512 kB, twice the file system
    manager.save(2, big)
    with pytest.raises(CheckpointWriteError) as err:
        durable(manager)
    line = str(err.value)
    assert line.startswith(f"no space left on {tiny_tmpfs} writing step 2 ({tiny_tmpfs}/step-00000002.tmp/__0_")
    assert "rank 0; needs ~0.000524 GB" in line and "\n" not in line
    assert list_steps(tiny_tmpfs) == [1] and not (tiny_tmpfs / "step-00000002.tmp").exists()
    assert manager.newest_complete(at_most=10) == 1
    assert_loads(manager, 1, want)
    manager.close()


def test_a_writer_process_killed_mid_write_fails_in_one_line_and_leaves_the_previous(tmp_path):
    model, opt = trained(8)
    manager = CheckpointManager(tmp_path, keep=2, pinned=set(), mode="async")
    small = build_state([model], [opt], step=1)
    want = snapshot(small)
    manager.save(1, small, optimizers=[opt])
    manager.finish()
    manager.save(2, {"model": {"w": torch.randn(64, 1024, 1024)}, "step": torch.tensor(2)})  # 256 MB
    folder, writer = step_dir(tmp_path, 2, "tmp"), manager.saves.writer.process
    deadline = time.monotonic() + 30
    while not any(folder.glob("*.distcp")) and time.monotonic() < deadline:  # the writer has begun its files
        time.sleep(0.001)
    os.kill(writer.pid, signal.SIGKILL)
    with pytest.raises(CheckpointWriteError) as err:
        manager.finish()
    assert str(err.value) == (
        f"writing step 2 to {tmp_path} failed on rank 0 ({folder}): its writer process (pid {writer.pid}) was killed "
        "by SIGKILL; the previous checkpoints are intact: rerun to resume from the newest (if it recurs, the node's "
        "kernel log says what killed a process)"
    )
    assert list_steps(tmp_path) == [1] and not folder.exists()
    assert_loads(manager, 1, want)
    manager.close()


def test_the_job_s_stop_signals_reach_the_writer_and_leave_its_write_to_finish(tmp_path):
    """Slurm signals every process of a job step, the writer too: its pre-timeout USR2 (and a time limit's TERM) are
    the rank's to handle, so the write in flight ends durable (the Slurm requeue drill's async writer died of it)."""
    manager = CheckpointManager(tmp_path, keep=2, pinned=set(), mode="async")
    state = {"model": {"w": torch.randn(64, 1024, 1024)}, "step": torch.tensor(2)}  # 256 MB
    want = snapshot(state)
    manager.save(2, state)
    folder, writer = step_dir(tmp_path, 2, "tmp"), manager.saves.writer.process
    deadline = time.monotonic() + 30
    while not any(folder.glob("*.distcp")) and time.monotonic() < deadline:  # the writer has begun its files
        time.sleep(0.001)
    for stop in (signal.SIGUSR2, signal.SIGTERM):
        os.kill(writer.pid, stop)
    manager.finish()
    assert writer.is_alive() and list_steps(tmp_path) == [2]
    assert_loads(manager, 2, want)
    manager.close()


def test_async_is_refused_at_start_up_when_host_memory_cannot_hold_the_copy(tmp_path):
    with pytest.raises(StagingError) as err:
        CheckpointManager(tmp_path, keep=1, pinned=set(), mode="async", staging_bytes=10**15)
    line = str(err.value)
    assert "checkpoint.mode=async stages a copy of every rank's state in host memory: 1 ranks x 1e+06 GB" in line
    assert line.endswith(
        "set checkpoint.mode=sync, or give the job more host memory (cluster.allocation.mem_gb) or fewer ranks per node"
    )
