"""The hot restart's decisions (launch.supervisor), without processes: which failures a new job step on a spare
follows, which go back to the stage (a new job, or its end), and the hosts of the next step."""

from __future__ import annotations

import pytest

from trainflow.config import compose
from trainflow.launch.supervisor import Supervisor, swapped
from trainflow.resilience.ledger import JobOutcome
from trainflow.resilience.verdict import JobFailure

NCCL = "torch.distributed.DistBackendError: NCCL error in: ProcessGroupNCCL.cpp:3356, remote process exited"


@pytest.fixture(scope="module")
def supervisor() -> Supervisor:
    cfg = compose("train_segment", ["experiment=smoke", "cluster.allocation.spare_nodes=1"])
    return Supervisor(cfg, task=None, attempt=0, submitted=0.0, exclude=frozenset(), earlier=[])


def died(host: str = "n2") -> JobFailure:
    return JobFailure(line=f"rank 1 on host {host} was killed by SIGKILL", kind=JobOutcome.DIED, rank=1, host=host)


def test_a_dead_rank_s_host_is_swapped_for_a_spare_and_a_used_up_spare_goes_back_to_the_stage(supervisor):
    verdict, why = supervisor.verdict(died(), None, [], [], (["n1", "n2"], ["n3"]))
    assert verdict.restart and verdict.exclude == {"n2"} and why == ""
    assert swapped(["n1", "n2"], ["n3"], {"n2"}) == (["n1", "n3"], [])
    assert swapped(["n1", "n2"], ["n3", "n4"], {"n1"}) == (["n3", "n2"], ["n4"])
    verdict, why = supervisor.verdict(died("n3"), None, [], [], (["n1", "n3"], []))
    assert verdict.restart and why == "the job's 1 spare node(s) are used up: a new job"


def test_a_failure_that_blames_no_host_is_restarted_on_the_same_hosts(supervisor):
    raised = JobFailure(line="x", kind=JobOutcome.RAISED, rank=0, host="n1", errors={0: NCCL, 1: NCCL}, world=2)
    verdict, why = supervisor.verdict(raised, None, [], [], (["n1", "n2"], []))
    assert verdict.restart and verdict.exclude == frozenset() and why == ""


def test_what_the_stage_must_judge_goes_back_to_it(supervisor):
    symmetric = JobFailure(line="every rank made no progress", kind=JobOutcome.HANG)
    verdict, why = supervisor.verdict(symmetric, None, [], [], (["n1", "n2"], ["n3"]))
    assert verdict.restart and why.startswith("a hang no rank's evidence pins")
    refused = JobFailure(line="x", kind=JobOutcome.RAISED, rank=0, host="n1", errors={0: "E: x"}, expected=True)
    verdict, why = supervisor.verdict(refused, None, [], [], (["n1", "n2"], ["n3"]))
    assert not verdict.restart and why == verdict.why and why.startswith("not restarted")
