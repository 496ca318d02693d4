"""Recovery from peers through the real local launcher (resilience.recovery=peers, launch.peers, launch.peer_recovery):
a SIGKILLed rank's node is replaced inside the job's step, the surviving ranks keep their processes, the replacement
takes its state from a live data-parallel replica, no checkpoint file is read, training goes on at the failed step, and
the segment ends bit for bit where an uninterrupted run ends.

Each drill trains RESTART_RUN's segment (6 steps, gloo, a checkpoint every 2 steps) on emulated nodes of one machine.

.venv/bin/python -m pytest tests/integration/test_peer_recovery.py
"""

from __future__ import annotations

import os
import re
import signal
import socket
import threading
import time
from pathlib import Path

import pytest

from tests.conftest import make_config, run_segment
from tests.support import RESTART_RUN, ledgers
from trainflow.config.run_folder import RunFolder
from trainflow.journal import Journal
from trainflow.launch.task import read_marker
from trainflow.resilience.goodput import Span

PEERS = ("cluster.allocation.nodes=2", "cluster.allocation.spare_nodes=1", "resilience.recovery=peers")


@pytest.fixture(scope="module")
def reference(tmp_path_factory, tokens) -> dict:
    return run_segment(tmp_path_factory.mktemp("reference"), tokens, *RESTART_RUN)


def markers(root: Path, *extra: str) -> dict:
    folder = Path(make_config("train_segment", root, *RESTART_RUN, *PEERS, *extra).io.submitit)
    (step,) = [p for p in folder.iterdir() if p.is_dir()]
    return {(m := read_marker(path)).rank: m for path in step.glob("*_task.json")}


def test_a_killed_rank_is_replaced_from_its_live_replica_and_the_survivor_keeps_its_process(
    tmp_path, tokens, reference
):
    summary = run_segment(tmp_path, tokens, *RESTART_RUN, *PEERS, "fault.step=3", "fault.rank=1", "fault.signal=KILL")
    jobs, spans = ledgers(tmp_path, *PEERS)
    assert [(j.outcome, j.step, j.generation) for j in jobs] == [("died", 0, 0), ("completed", 0, 1)], jobs
    broken, recovered = jobs
    assert broken.line.startswith("rank 1 on host ") and "killed by SIGKILL" in broken.line, broken.line
    host = socket.gethostname()
    assert broken.verdict == f"recovered from peers: rank(s) 1 started on {host}, their state from rank(s) 0 at step 3"
    assert recovered.recovery == "peers" and recovered.checkpoint_bytes_read == 0, recovered
    ends = markers(tmp_path)
    assert recovered.kept_pids == {"0": ends[0].pid}  # the survivor's process trained to the end
    assert ends[1].pid != ends[0].pid and ends[1].ended is not None
    assert 0 < recovered.first_step_s < 30, recovered
    steps = sorted(s.step for s in spans if s.kind == "step")
    assert steps == [0, 1, 2, 3, 4, 5], steps  # step 3 retried once, nothing before it redone
    assert summary["state_digest"] == reference["state_digest"]


@pytest.mark.slow  # four ranks and a reference: ~90 s on the 2-core VM
def test_a_killed_tp_rank_s_node_is_replaced_and_both_its_ranks_take_their_shards_from_the_other_replica(
    tmp_path, tokens
):
    # dp2 x tp2 on two emulated nodes of two ranks (a replica each): rank 2 dies; its node's ranks 2 and 3 start anew,
    # each taking its tensor-parallel shard from rank 0 and 1, the live ranks of the other replica.
    # Rank 1 waits in a collective with ranks 0 and 3 only, which gloo cannot abort: it leaves at the timeout.
    layout = ("parallel=dp2_tp2", "cluster.allocation.nodes=2", "cluster.runtime.collective_timeout_s=15")
    reference = run_segment(tmp_path / "reference", tokens, *RESTART_RUN, layout[0])  # one job: one node here
    fault = ("fault.step=3", "fault.rank=2", "fault.signal=KILL")
    summary = run_segment(tmp_path / "peers", tokens, *RESTART_RUN, *PEERS, *layout, *fault)
    jobs, _ = ledgers(tmp_path / "peers", *PEERS, *layout)
    assert [(j.outcome, j.generation) for j in jobs] == [("died", 0), ("completed", 1)], jobs
    assert jobs[0].verdict.endswith(
        "rank(s) 2,3 started on " + socket.gethostname() + ", their state from rank(s) 0,1 at step 3"
    )
    ends = markers(tmp_path / "peers", *layout)
    assert jobs[1].kept_pids == {"0": ends[0].pid, "1": ends[1].pid} and jobs[1].checkpoint_bytes_read == 0, jobs[1]
    assert summary["state_digest"] == reference["state_digest"]


@pytest.mark.slow  # a reference and a recovery: ~60 s on the 2-core VM
def test_a_node_without_a_replica_is_restored_from_its_partner_s_snapshot_losing_at_most_snapshot_steps(
    tmp_path, tokens
):
    # pp2 on two emulated nodes: each node holds one pipeline stage, no replica anywhere. Snapshots every 2 steps, the
    # only file-system checkpoint at the end: rank 1 (stage 1, node 1's only rank) dies at step 5. It starts on the
    # spare from the copy of its step-4 snapshot rank 0 holds (another stage's tensors, held as bytes); rank 0 goes
    # back to its own; step 4 is trained again (1 step lost, at most 2), nothing read from a checkpoint.
    layout = ("parallel=pp2_1f1b", "cluster.allocation.nodes=2", "checkpoint.interval_steps=6")
    reference = run_segment(tmp_path / "reference", tokens, *RESTART_RUN, layout[0], layout[2])
    snapshots = ("checkpoint.snapshot_steps=2", "fault.step=5", "fault.rank=1", "fault.signal=KILL")
    summary = run_segment(tmp_path / "peers", tokens, *RESTART_RUN, *PEERS, *layout, *snapshots)
    jobs, spans = ledgers(tmp_path / "peers", *PEERS, *layout, snapshots[0])
    assert [(j.outcome, j.generation) for j in jobs] == [("died", 0), ("completed", 1)], jobs
    assert jobs[0].verdict.endswith("their state from the snapshots held by rank(s) 0 at step 4"), jobs[0].verdict
    ends = markers(tmp_path / "peers", *layout, snapshots[0])
    assert jobs[1].kept_pids == {"0": ends[0].pid} and jobs[1].checkpoint_bytes_read == 0, jobs[1]
    trained = sorted(s.step for s in spans if s.kind == "step")
    assert trained == [0, 1, 2, 3, 4, 4, 5], trained  # step 4 again: one step lost
    assert summary["state_digest"] == reference["state_digest"]


@pytest.mark.slow  # four ranks and a reference: ~90 s on the 2-core VM
def test_both_ranks_of_a_node_without_a_replica_are_restored_from_their_partners_snapshots(tmp_path, tokens):
    # tp2 x pp2 on two emulated nodes: node 1 holds pipeline stage 1 (ranks 2 and 3), no replica anywhere. Snapshots
    # every 2 steps, the file-system checkpoint only at the end. Once step 4 has trained, both ranks of node 1 are
    # SIGKILLed at once; they start on the spare from the copies ranks 0 and 1 hold of their newest snapshot, ranks 0
    # and 1 go back to their own, at most 2 steps are trained again, nothing is read from a checkpoint.
    # A survivor may wait in a collective with the other, which gloo cannot abort: it leaves at the timeout (15 s).
    layout = ("parallel=tp2_pp2", "cluster.allocation.nodes=2", "checkpoint.interval_steps=6")
    reference = run_segment(tmp_path / "reference", tokens, *RESTART_RUN, layout[0], layout[2])
    peers = (*PEERS, *layout, "checkpoint.snapshot_steps=2", "cluster.runtime.collective_timeout_s=15")
    cfg = make_config("train_segment", tmp_path / "peers", *RESTART_RUN, *peers)
    killer = threading.Thread(target=kill_node_1_after_step_4, args=(cfg,), daemon=True)
    killer.start()
    summary = run_segment(tmp_path / "peers", tokens, *RESTART_RUN, *peers)
    killer.join()
    jobs, spans = ledgers(tmp_path / "peers", *peers)
    assert [(j.outcome, j.generation) for j in jobs] == [("died", 0), ("completed", 1)], jobs
    assert re.search(r"from the snapshots held by rank\(s\) 0,1 at step [24]$", jobs[0].verdict), jobs[0].verdict
    ends = markers(tmp_path / "peers", *peers)
    assert jobs[1].kept_pids == {"0": ends[0].pid, "1": ends[1].pid} and jobs[1].checkpoint_bytes_read == 0, jobs[1]
    trained = [s.step for s in spans if s.kind == "step"]
    assert sorted(set(trained)) == list(range(6)) and len(trained) - 6 <= 2, trained  # at most snapshot_steps lost
    assert summary["state_digest"] == reference["state_digest"]


def kill_node_1_after_step_4(cfg) -> None:  # noqa: ANN001 (a composed config)
    """SIGKILL ranks 2 and 3 (node 1's) together once rank 0 has recorded step 4 as trained."""
    spans, deadline = Journal(RunFolder.spans_log(cfg.io.checkpoints), Span), time.monotonic() + 300
    while time.monotonic() < deadline:
        if spans.path.exists() and any(s.kind == "step" and s.step >= 4 for s in spans.read()):
            for path in Path(cfg.io.submitit).glob("*.0/*_task.json"):
                if (m := read_marker(path)).rank in (2, 3):
                    os.kill(m.pid, signal.SIGKILL)
            return
        time.sleep(0.05)
