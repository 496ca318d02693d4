"""Goodput drills on the local Slurm cluster of two emulated nodes: a dead rank's job ends within the detection time
and the stage restarts it on the other node (the failed node in the new job's --exclude), bitwise equal to a run
without the fault; a hung rank is named and the job ends (srun's --kill-on-bad-exit ends the stopped one).

bash scripts/slurm_cluster.sh start --nodes 2 && .venv/bin/python -m pytest tests/slurm/test_restarts_on_slurm.py
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import submitit

from tests.conftest import make_config, run_segment
from tests.slurm.conftest import idle_nodes
from tests.support import RESTART_RUN as BASE
from tests.support import ledgers
from trainflow.launch import LaunchError
from trainflow.launch.failure import read_markers

pytestmark = pytest.mark.slurm

SLURM = ("cluster=slurm_local", "cluster.allocation.nodes=1")


def two_nodes() -> None:
    if len(idle_nodes()) < 2:
        pytest.skip("a restart on another node needs 2 nodes: bash scripts/slurm_cluster.sh start --nodes 2")


def test_a_dead_rank_s_node_is_left_out_of_the_restarted_job(tmp_path, tokens):
    two_nodes()
    summary = run_segment(
        tmp_path / "drill", tokens, *BASE, *SLURM, "fault.step=3", "fault.rank=1", "fault.signal=KILL"
    )
    jobs, spans = ledgers(tmp_path / "drill", *SLURM)
    assert [j.outcome for j in jobs] == ["died", "completed"]
    failed_host = re.match(r"rank 1 on host (\S+) was killed by SIGKILL", jobs[0].line)[1]
    assert jobs[0].verdict == f"restart 1 of 3, leaving out {failed_host}"
    assert jobs[1].exclude == [failed_host]
    folder = Path(make_config("train_segment", tmp_path / "drill", *BASE, *SLURM).io.submitit)
    script = (folder / f"{jobs[1].job_id}_submission.sh").read_text()
    assert f"#SBATCH --exclude={failed_host}\n" in script and "--kill-on-bad-exit=1" in script
    hosts = {m.host for m in read_markers(submitit.SlurmJob(folder, jobs[1].job_id, tasks=(0, 1))).values()}
    assert hosts and failed_host not in hosts
    last = max(s.started + s.seconds for s in spans if s.started < jobs[0].ended)
    assert jobs[0].ended - last < 30 + 10  # failure_detect_s + 10 s
    reference = run_segment(tmp_path / "reference", tokens, *BASE)  # locally, no fault
    assert summary["state_digest"] == reference["state_digest"]
    assert summary["goodput"]["unaccounted"] < 0.02


@pytest.mark.slow
def test_a_hung_rank_on_slurm_is_named_and_its_job_ended(tmp_path, tokens):
    hang = ("resilience.hang_detect_s=5", "resilience.heartbeat_s=1", "resilience.max_restarts=0")
    with pytest.raises(LaunchError) as err:
        run_segment(
            tmp_path,
            tokens,
            *BASE,
            *SLURM,
            "fault.step=3",
            "fault.rank=1",
            "fault.signal=STOP",
            *hang,
        )
    line = str(err.value)
    assert re.search(r"rank 1 on host n[12] stopped responding for \d+ s \(its last beat: step", line), line
    jobs, spans = ledgers(tmp_path, *SLURM, *hang)
    assert jobs[0].outcome == "hang"
    assert jobs[0].ended - max(s.started + s.seconds for s in spans) < 5 + 10 + 20  # Slurm's state settles for 15 s


@pytest.mark.slow
def test_a_stalled_rank_on_slurm_is_blamed_and_only_its_node_left_out(tmp_path, tokens):
    # Rank 1's main thread blocks at step 3 while its heartbeat beats on; the collective counts name it, and the
    # restart runs on the other node, ending where a run without the fault ends.
    two_nodes()
    stall = (
        "fault.step=3",
        "fault.rank=1",
        "fault.signal=STALL",
        "resilience.hang_detect_s=5",
        "resilience.heartbeat_s=1",
    )
    summary = run_segment(tmp_path / "drill", tokens, *BASE, *SLURM, *stall)
    jobs, _ = ledgers(tmp_path / "drill", *SLURM, "resilience.hang_detect_s=5", "resilience.heartbeat_s=1")
    assert [j.outcome for j in jobs] == ["hang", "completed"]
    found = re.match(
        r"rank 1 on host (n[12]) made no progress for \d+ s .* a stuck main thread: it had not entered", jobs[0].line
    )
    assert found, jobs[0].line
    assert jobs[0].verdict == f"restart 1 of 3, leaving out {found[1]}" and jobs[1].exclude == [found[1]]
    reference = run_segment(tmp_path / "reference", tokens, *BASE)  # locally, no fault
    assert summary["state_digest"] == reference["state_digest"]
