"""Hot restarts on the local Slurm cluster of three emulated nodes, 2 + 1 spare (cluster.allocation.spare_nodes=1,
launch.supervisor): after a dead, a stalled rank or a node Slurm marks down, a new job step inside the same job runs
on the healthy node and the spare, the failed node left out, and the segment ends bit for bit where a run without the
fault ends; after a symmetric hang the gate's checks run as a step on the job's own nodes and, finding none slow, the
next step runs on them again. No second job is submitted.

bash scripts/slurm_cluster.sh start --nodes 3 && .venv/bin/python -m pytest tests/slurm/test_hot_restart_on_slurm.py
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import threading
import time
from pathlib import Path

import pytest
import submitit

from tests.conftest import REPO, make_config, run_segment
from tests.slurm.conftest import idle_nodes, scontrol, three_nodes
from tests.support import RESTART_RUN as BASE
from tests.support import ledgers
from trainflow.launch.failure import read_markers
from trainflow.resilience.ledger import JobRun

pytestmark = [pytest.mark.slurm, pytest.mark.slow]

SLURM = ("cluster=slurm_local", "cluster.allocation.nodes=2", "cluster.allocation.spare_nodes=1")


@pytest.fixture(scope="module")
def reference(tmp_path_factory, tokens) -> dict:
    return run_segment(tmp_path_factory.mktemp("reference"), tokens, *BASE)  # locally, no fault


def step_hosts(root: Path, run: JobRun, *extra: str) -> set[str]:
    """The nodes the ranks of the ledger's job step `run` ran on (their task markers)."""
    folder = Path(make_config("train_segment", root, *BASE, *SLURM, *extra).io.submitit)
    job = run.job_id.split(".")[0]
    return {m.host for m in read_markers(submitit.SlurmJob(folder / run.job_id, job, tasks=(0, 1))).values()}


def assert_hot_restarted(root: Path, summary: dict, reference: dict, *extra: str) -> list[JobRun]:
    """One job of two steps, the second on the first's healthy node and the spare, within 60 s, ending bitwise."""
    jobs, _ = ledgers(root, *SLURM, *extra)
    assert [j.step for j in jobs] == [0, 1] and jobs[1].outcome == "completed", jobs
    job = jobs[0].job_id.removesuffix(".0")
    assert jobs[1].job_id == f"{job}.1" and {j.job_id.split(".")[0] for j in jobs} == {job}
    folder = Path(make_config("train_segment", root, *BASE, *SLURM, *extra).io.submitit)
    assert len(list(folder.glob("*_submitted.pkl"))) == 1  # the supervisor's: no second job
    (failed,) = jobs[0].left_out
    before, after = step_hosts(root, jobs[0], *extra), step_hosts(root, jobs[1], *extra)
    assert failed in before and failed not in after and len(after) == 2 and before & after, (before, after)
    assert 0 < jobs[1].first_step_s < 60, jobs[1]
    assert summary["state_digest"] == reference["state_digest"]
    return jobs


def test_a_dead_rank_s_node_is_left_out_of_a_new_step_in_the_same_job(tmp_path, tokens, reference):
    three_nodes()
    summary = run_segment(tmp_path, tokens, *BASE, *SLURM, "fault.step=3", "fault.rank=1", "fault.signal=KILL")
    jobs = assert_hot_restarted(tmp_path, summary, reference)
    assert jobs[0].outcome == "died"
    assert re.match(rf"rank 1 on host {jobs[0].left_out[0]} was killed by SIGKILL", jobs[0].line), jobs[0].line


def test_a_stalled_rank_s_node_is_left_out_of_a_new_step_in_the_same_job(tmp_path, tokens, reference):
    three_nodes()
    stall = ("resilience.hang_detect_s=5", "resilience.heartbeat_s=1")
    summary = run_segment(tmp_path, tokens, *BASE, *SLURM, "fault.step=3", "fault.rank=1", "fault.signal=STALL", *stall)
    jobs = assert_hot_restarted(tmp_path, summary, reference, *stall)
    assert jobs[0].outcome == "hang"
    assert jobs[0].line.startswith(f"rank 1 on host {jobs[0].left_out[0]} made no progress"), jobs[0].line


def test_a_symmetric_hang_is_checked_inside_the_job_and_no_healthy_node_left_out(tmp_path, tokens, reference):
    # Every rank waits in one collective that never completes (WEDGE: a failed link or switch): no rank's evidence
    # names a node, so the supervisor runs the gate's checks as a step on the job's own two nodes (srun inside the
    # allocation), finds no slow node, and the next training step runs on the same nodes, in the same job.
    three_nodes()
    hang = ("resilience.hang_detect_s=5", "resilience.heartbeat_s=1")
    summary = run_segment(tmp_path, tokens, *BASE, *SLURM, "fault.step=5", "fault.signal=WEDGE", *hang)
    jobs, _ = ledgers(tmp_path, *SLURM, *hang)
    assert [(j.outcome, j.step) for j in jobs] == [("hang", 0), ("completed", 1)], jobs
    assert jobs[0].verdict == "restart 1 of 3 (the gate's checks inside the job found no slow host)", jobs[0]
    assert jobs[0].left_out == [] and {j.job_id.split(".")[0] for j in jobs} == {jobs[0].job_id.split(".")[0]}
    assert step_hosts(tmp_path, jobs[0], *hang) == step_hosts(tmp_path, jobs[1], *hang)  # the spare not needed
    folder = Path(make_config("train_segment", tmp_path, *BASE, *SLURM, *hang).io.submitit)
    assert len(list(folder.glob("*_submitted.pkl"))) == 1  # the supervisor's: no job for the checks
    assert list(folder.glob(f"{jobs[0].job_id.split('.')[0]}-check.0/*_1_result.pkl"))  # the check: a job step
    assert summary["state_digest"] == reference["state_digest"]


def test_a_node_slurm_marks_down_is_left_out_of_a_new_step_in_the_same_job(tmp_path, tokens, reference):
    # While step 0 trains (rank 1 slowed to 1 s a step), rank 1's node is set down as a failed node would be: the job
    # survives it (--no-kill), its step does not, and step 1 runs on the other node and the spare. The node is
    # resumed at the end, whatever happens.
    three_nodes()
    idle = len(idle_nodes())
    slow = ("fault.rank=1", "fault.slow_ms=1000")
    # Composed here: Hydra's global state is not the drill thread's to share with the run composing beside it.
    folder = Path(make_config("train_segment", tmp_path, *BASE, *SLURM, *slow).io.submitit)
    drill = threading.Thread(target=down_rank_1_node, args=(folder,), daemon=True)
    drill.start()
    summary = run_segment(tmp_path, tokens, *BASE, *SLURM, *slow)
    drill.join()
    jobs = assert_hot_restarted(tmp_path, summary, reference, *slow)
    assert jobs[0].outcome == "died" and f"node {jobs[0].left_out[0]} failed" in jobs[0].line, jobs[0].line
    assert len(idle_nodes()) == idle  # the node is back for the tests after this one


def test_a_spare_whose_slurmd_is_dead_is_skipped_and_the_next_spare_used(tmp_path, tokens, reference):
    # 2 + 2 spares. Once step 0 trains, the first spare's slurmd is killed (Slurm lists the node as allocated for
    # minutes more, until its SlurmdTimeout); rank 1 then dies at step 3. The supervisor tries a task on each spare
    # before it puts a step there, skips the dead one in a line, and step 1 runs on the healthy node and the second
    # spare, bitwise. Before this, step 1 went on the dead spare, srun could not start it (the step LOST), and the
    # restarts on the same hosts ran out.
    if len(idle_nodes()) < 4:
        pytest.skip("2 nodes + 2 spares need 4 idle nodes: bash scripts/slurm_cluster.sh start --nodes 4")
    spares = (*SLURM[:2], "cluster.allocation.spare_nodes=2", "fault.rank=1", "fault.slow_ms=1000")
    folder = Path(make_config("train_segment", tmp_path, *BASE, *spares).io.submitit)
    killed: list[str] = []
    drill = threading.Thread(target=kill_first_spare_slurmd, args=(folder, killed), daemon=True)
    drill.start()
    try:
        summary = run_segment(tmp_path, tokens, *BASE, *spares, "fault.step=3", "fault.signal=KILL")
    finally:
        drill.join()
        subprocess.run(["bash", str(REPO / "scripts/slurm_cluster.sh"), "start", "--nodes", "4"], capture_output=True)
    (dead,) = killed
    jobs = assert_hot_restarted(tmp_path, summary, reference, *spares)
    assert dead not in step_hosts(tmp_path, jobs[1], *spares), jobs
    supervisor_log = next(folder.glob("*_0_log.err")).read_text()
    assert re.search(
        rf"Skipped the spare {dead}: it cannot start a task \(Task launch for StepId=\S+ failed on node "
        rf"{dead}: ",
        supervisor_log,
    ), supervisor_log[-3000:]


def kill_first_spare_slurmd(folder: Path, killed: list[str]) -> None:
    """Once step 0's rank 1 has trained a step, kill the slurmd of the job's first spare (its node in the job's list,
    not one of step 0's), by the pid file scripts/slurm_cluster.sh wrote; its name goes in `killed`."""
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline:
        for marker in folder.glob("*.0/*_1_task.json"):
            job_id = marker.name.split("_")[0]
            job = submitit.SlurmJob(marker.parent, job_id, tasks=(0, 1))
            markers = read_markers(job)
            if len(markers) == 2 and markers[1].first_step is not None:
                listed = subprocess.run(["squeue", "-h", "-j", job_id, "-o", "%N"], capture_output=True, text=True)
                names = subprocess.run(
                    ["scontrol", "show", "hostnames", listed.stdout.strip()], capture_output=True, text=True
                ).stdout.split()
                spare = next(n for n in names if n not in {m.host for m in markers.values()})
                pid = int(Path(f"/run/slurm/slurmd-{spare}.pid").read_text())
                assert Path(f"/proc/{pid}/comm").read_text().strip() == "slurmd"  # the cluster script's own daemon
                os.kill(pid, signal.SIGKILL)
                killed.append(spare)
                return
        time.sleep(0.3)


def down_rank_1_node(folder: Path) -> None:
    """Set the node of step 0's rank 1 (whose job's files are in `folder`) down once that rank has trained a step;
    resume it once step 1 started."""
    deadline, node = time.monotonic() + 300, None
    try:
        while time.monotonic() < deadline and node is None:
            for marker in folder.glob("*.0/*_1_task.json"):
                job = submitit.SlurmJob(marker.parent, marker.name.split("_")[0], tasks=(0, 1))
                if (m := read_markers(job).get(1)) and m.first_step is not None:
                    node = m.host
            time.sleep(0.5)
        if node:
            scontrol("update", f"nodename={node}", "state=down", "reason=trainflow-drill")
            while time.monotonic() < deadline and not list(folder.glob("*.1/*_1_task.json")):
                time.sleep(0.5)
    finally:
        if node:  # Slurm may have returned it to service already (ReturnToService=2): then resume is refused
            scontrol("update", f"nodename={node}", "state=resume")
