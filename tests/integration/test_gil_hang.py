"""A rank whose main thread holds the GIL inside a C call stops every Python thread of its process, its heartbeat's
too, so the abort that dumps the live ranks' stacks never runs there; faulthandler's own thread
(launch.hang.StacksWatchdog) still writes that rank's stacks before rank 0's verdict ends the job. Two processes on
the real heartbeat and its TCPStore, no training (~10 s)."""

from __future__ import annotations

import ctypes
import json
import multiprocessing as mp
import os
import time

import torch.distributed as dist
from submitit.core.utils import JobPaths

from trainflow.config import compose
from trainflow.launch.hang import HANG_EXIT, stacks_path
from trainflow.launch.heartbeat import Heartbeat

THRESHOLD_S, BEAT_S = 2, 0.25


def hold_the_gil() -> None:
    """libc's sleep called through ctypes.PyDLL, which keeps the GIL for the call (time.sleep releases it)."""
    ctypes.PyDLL(None).sleep(120)


def rank_main(rank: int, port: int, folder: str) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    overrides = [f"resilience.hang_detect_s={THRESHOLD_S}", f"resilience.heartbeat_s={BEAT_S}"]
    cfg = compose("train_segment", ["experiment=smoke", *overrides])
    with Heartbeat.start(
        cfg.cluster.runtime, cfg.resilience, rank=rank, world=2, paths=JobPaths(folder, job_id="7")
    ) as beat:
        beat.progress("data", 0)
        time.sleep(3 * BEAT_S)  # both ranks beat a few times first
        if rank == 1:
            hold_the_gil()
        time.sleep(120)  # rank 0 waits with the GIL released: its heartbeat judges rank 1 and ends it


def test_a_rank_holding_the_gil_in_a_c_call_still_writes_its_stacks(tmp_path):
    rendezvous = dist.TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False)
    spawn = mp.get_context("spawn")
    ranks = [spawn.Process(target=rank_main, args=(r, rendezvous.port, str(tmp_path))) for r in (0, 1)]
    for p in ranks:
        p.start()
    try:
        ranks[0].join(timeout=90)
        assert ranks[0].exitcode == HANG_EXIT  # rank 0 judged rank 1 silent and left
        report = json.loads((tmp_path / "7_hang.json").read_text())
        assert report["rank"] == 1 and not report["alive"]
        stacks = stacks_path(JobPaths(tmp_path, job_id="7"), 1).read_text()
        assert stacks.startswith("Timeout") and "Thread" in stacks and "hold_the_gil" in stacks, stacks
        assert ranks[1].is_alive()  # still inside the C call: only faulthandler's thread could write
    finally:
        for p in ranks:
            p.kill()
            p.join()
