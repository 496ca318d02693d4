"""Recovery from peers on the local Slurm cluster of three emulated nodes, 2 + 1 spare (resilience.recovery=peers):
after a SIGKILLed rank or a node Slurm marks down, the failed node's ranks start as a job step on the spare and take
their state from the live replica, the survivors keep their processes inside the first step, no checkpoint file is
read, and the segment ends bit for bit where a run without the fault ends, faster from the failure to the next step
than the job-level hot restart.

bash scripts/slurm_cluster.sh start --nodes 3 && .venv/bin/python -m pytest tests/slurm/test_peer_recovery_on_slurm.py
"""

from __future__ import annotations

import threading
import time
from pathlib import Path

import pytest

from tests.conftest import make_config, run_segment
from tests.slurm.conftest import scontrol, three_nodes
from tests.support import RESTART_RUN as BASE
from tests.support import ledgers
from trainflow.launch.task import read_marker
from trainflow.resilience.ledger import JobRun

pytestmark = [pytest.mark.slurm, pytest.mark.slow]

SLURM = ("cluster=slurm_local", "cluster.allocation.nodes=2", "cluster.allocation.spare_nodes=1")
PEERS = (*SLURM, "resilience.recovery=peers")


@pytest.fixture(scope="module")
def reference(tmp_path_factory, tokens) -> dict:
    return run_segment(tmp_path_factory.mktemp("reference"), tokens, *BASE)  # locally, no fault


def step_markers(root: Path, *extra: str) -> dict:
    folder = Path(make_config("train_segment", root, *BASE, *extra).io.submitit)
    (step,) = [p for p in folder.iterdir() if p.is_dir() and "-check" not in p.name]
    return {(m := read_marker(path)).rank: m for path in step.glob("*_task.json")}


def assert_recovered(root: Path, summary: dict, reference: dict, *extra: str) -> list[JobRun]:
    """One job step of two generations: the failed node replaced by the spare, the survivor's process kept, nothing
    read from a checkpoint file, the end bitwise."""
    jobs, _ = ledgers(root, *PEERS, *extra)
    assert [(j.outcome, j.step, j.generation) for j in jobs] == [("died", 0, 0), ("completed", 0, 1)], jobs
    broken, recovered = jobs
    (failed,) = broken.left_out
    markers = step_markers(root, *PEERS, *extra)
    assert recovered.kept_pids == {"0": markers[0].pid} and recovered.checkpoint_bytes_read == 0, recovered
    assert markers[1].host != failed and markers[0].host != markers[1].host, markers
    assert 0 < recovered.first_step_s < 60, recovered
    assert summary["state_digest"] == reference["state_digest"]
    return jobs


def test_a_killed_rank_s_node_is_replaced_by_the_spare_from_its_live_replica(tmp_path, tokens, reference, capsys):
    # The same failure under the job-level hot restart too: recovery from peers reaches its next step sooner.
    three_nodes()
    fault = ("fault.step=3", "fault.rank=1", "fault.signal=KILL")
    summary = run_segment(tmp_path / "peers", tokens, *BASE, *PEERS, *fault)
    jobs = assert_recovered(tmp_path / "peers", summary, reference)
    assert "rank 1 on host " in jobs[0].line and "SIGKILL" in jobs[0].line, jobs[0].line
    run_segment(tmp_path / "job", tokens, *BASE, *SLURM, *fault)
    restarted, _ = ledgers(tmp_path / "job", *SLURM)
    assert [(j.outcome, j.step) for j in restarted] == [("died", 0), ("completed", 1)], restarted
    with capsys.disabled():
        print(f"\nfailure to first step: peers {jobs[1].first_step_s:.2f} s, job {restarted[1].first_step_s:.2f} s")
    assert jobs[1].first_step_s < restarted[1].first_step_s, (jobs[1], restarted[1])


def test_a_node_slurm_marks_down_is_replaced_by_the_spare_from_its_live_replica(tmp_path, tokens, reference):
    # While the step trains (rank 1 slowed to 1 s a step), rank 1's node is set down as a failed node would be: Slurm
    # ends the step's tasks there, the job survives it (--no-kill), and so does the survivor on the other node.
    three_nodes()
    slow = ("fault.rank=1", "fault.slow_ms=1000")
    folder = Path(make_config("train_segment", tmp_path, *BASE, *PEERS, *slow).io.submitit)
    drill = threading.Thread(target=down_rank_1_node_once_replaced, args=(folder,), daemon=True)
    drill.start()
    summary = run_segment(tmp_path, tokens, *BASE, *PEERS, *slow)
    drill.join()
    jobs = assert_recovered(tmp_path, summary, reference, *slow)
    assert f"node {jobs[0].left_out[0]} failed" in jobs[0].line, jobs[0].line


def down_rank_1_node_once_replaced(folder: Path) -> None:
    """Set the node of rank 1 down once it has trained a step; resume it once a replacement rank 1 runs elsewhere."""
    deadline, node = time.monotonic() + 300, None
    try:
        while time.monotonic() < deadline:
            markers = [read_marker(p) for p in folder.glob("*.0/*_1_task.json")]
            if node is None and markers and markers[0].first_step is not None:
                node = markers[0].host
                scontrol("update", f"nodename={node}", "state=down", "reason=trainflow-drill")
            if node is not None and markers and markers[0].host != node:
                return
            time.sleep(0.5)
    finally:
        if node:  # Slurm may have returned it to service already (ReturnToService=2): then resume is refused
            scontrol("update", f"nodename={node}", "state=resume")


def test_a_killed_tp_rank_s_node_is_replaced_and_both_its_ranks_take_their_shards_from_the_other_replica(
    tmp_path, tokens
):
    # dp2 x tp2, a replica on each node: rank 2 dies, its node-mate rank 3 leaves, both start on the spare and take
    # their shards from ranks 0 and 1, whose processes go on. Rank 1 waits in a gradient all-reduce with rank 3 that
    # gloo cannot abort: it reports once rank 3 has left (launch.peers).
    three_nodes()
    layout = ("parallel=dp2_tp2", "cluster.runtime.collective_timeout_s=15")
    reference = run_segment(tmp_path / "reference", tokens, *BASE, layout[0])
    fault = ("fault.step=3", "fault.rank=2", "fault.signal=KILL")
    summary = run_segment(tmp_path / "peers", tokens, *BASE, *PEERS, *layout, *fault)
    jobs, _ = ledgers(tmp_path / "peers", *PEERS, *layout)
    assert [(j.outcome, j.generation) for j in jobs] == [("died", 0), ("completed", 1)], jobs
    assert jobs[0].verdict.endswith("their state from rank(s) 0,1 at step 3"), jobs[0].verdict
    markers = step_markers(tmp_path / "peers", *PEERS, *layout)
    assert jobs[1].kept_pids == {"0": markers[0].pid, "1": markers[1].pid}, jobs[1]
    assert jobs[1].checkpoint_bytes_read == 0 and {markers[2].host} == {markers[3].host} != {markers[0].host}
    assert summary["state_digest"] == reference["state_digest"]
