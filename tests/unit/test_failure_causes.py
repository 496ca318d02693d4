"""Failures judged by their cause: the exception a rank's traceback ends in (not its last line), and device errors
their hosts confirm restarted however often and on however many ranks they strike, each such host left out."""

from __future__ import annotations

import subprocess

import submitit

from trainflow.launch import job_end
from trainflow.launch.failure import analyse, exception_line
from trainflow.resilience.evidence import NodeEvidence
from trainflow.resilience.ledger import JobOutcome
from trainflow.resilience.verdict import JobFailure, judge

HINTS = (
    "CUDA kernel errors might be asynchronously reported at some other API call, so the stacktrace below might be "
    "incorrect.\nFor debugging consider passing CUDA_LAUNCH_BLOCKING=1\nCompile with `TORCH_USE_CUDA_DSA` to enable "
    "device-side assertions.\n"
)


def trace(exception: str) -> str:
    """A task's traceback as submitit records it (traceback.format_exc), chained as torch's often are."""
    return (
        "Traceback (most recent call last):\n"
        '  File "/x/trainflow/train/trainer.py", line 120, in train_step\n'
        "    loss = self.forward_backward(inputs, targets)\n"
        "           ^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^\n"
        "ValueError: first\n\nThe above exception was the direct cause of the following exception:\n\n"
        "Traceback (most recent call last):\n"
        '  File "/x/submitit/core/submission.py", line 55, in process_job\n'
        "    result = delayed.result()\n"
        f"{exception}\n"
    )


ECC = f"torch.AcceleratorError: CUDA error: uncorrectable ECC error encountered\n{HINTS}"
ILLEGAL = f"torch.AcceleratorError: CUDA error: an illegal memory access was encountered\n{HINTS}"
NCCL = "torch.distributed.DistBackendError: NCCL error in: ProcessGroupNCCL.cpp:3356, remote process exited"


def raised(host: str, text: str, *, ranks=(0,), world: int = 8) -> JobFailure:
    errors = {r: exception_line(trace(text)) for r in ranks}
    return JobFailure(line="line", kind=JobOutcome.RAISED, rank=ranks[0], host=host, errors=errors, world=world)


def test_the_exception_line_is_the_exception_not_the_last_hint():
    assert exception_line(trace(ECC)) == "torch.AcceleratorError: CUDA error: uncorrectable ECC error encountered"
    assert exception_line(trace("KeyError: 'w'")) == "KeyError: 'w'"
    assert exception_line("no traceback here\nlast words") == "last words"


def test_two_cuda_errors_their_hosts_confirm_are_both_restarted_each_without_its_host():
    confirmed = {
        h: NodeEvidence(h, kernel=[f"NVRM: Xid (PCI:0000:10:1c): 48, {h}"]) for h in ("nid001", "nid002", "nid003")
    }
    first = raised("nid001", ECC)
    verdict = judge(first, [], max_restarts=3, restarts=0, evidence=confirmed)
    assert verdict.restart and verdict.exclude == {"nid001"}
    second = raised("nid002", ILLEGAL)
    verdict = judge(second, [first], max_restarts=3, restarts=1, evidence=confirmed)
    assert verdict.restart and verdict.exclude == {"nid002"}, verdict.why
    # the same device error again on another host that confirms it: still the machine, not the code
    assert judge(raised("nid003", ILLEGAL), [first, second], max_restarts=3, restarts=2, evidence=confirmed).restart


def test_an_nccl_error_on_every_rank_is_restarted_blaming_no_host():
    every = raised("nid001", NCCL, ranks=tuple(range(8)))
    verdict = judge(every, [], max_restarts=3, restarts=0)
    assert verdict.restart and verdict.exclude == frozenset(), verdict.why


def test_the_code_s_own_exceptions_are_restarted_once_at_most():
    every = raised("nid001", "ZeroDivisionError: division by zero", ranks=tuple(range(8)))
    assert judge(every, [], max_restarts=3, restarts=0).restart
    assert "at once again" in judge(every, [every], max_restarts=3, restarts=1).why
    once, again = raised("nid001", "KeyError: 'w'"), raised("nid002", "KeyError: 'w'")
    assert "the same exception in two jobs" in judge(again, [once], max_restarts=3, restarts=1).why


def test_the_rank_that_raised_first_is_not_one_that_lost_its_peer(tmp_path):
    # Rank 1 raised a device error and ended; rank 0, waiting for it in a collective, raised gloo's "Connection
    # closed by peer" before the log said rank 1 had ended: the failure is rank 1's.
    job = submitit.local.local.LocalJob(tmp_path, "7", tasks=(0, 1))
    lost = "RuntimeError: [gloo/transport/tcp/pair.cc:553] Connection closed by peer [127.0.0.1]:41167. This is " + (
        "typically caused by a remote worker crashing."
    )
    outcomes = [("error", trace(lost)), ("error", trace(ILLEGAL))]
    failure = analyse(job, "local", ("", 0), outcomes)
    assert failure.rank == 1 and "an illegal memory access" in failure.line


def test_a_node_failure_is_a_death_on_that_node_restarted_without_it(tmp_path, monkeypatch):
    # Slurm ended the job NODE_FAIL (or BOOT_FAIL): the node Slurm now holds down is the failure's host, and the
    # restart leaves it out; a job whose nodes are all up again blames none (and is still restarted).
    job = submitit.SlurmJob(tmp_path, "12", tasks=(0, 1))
    for state in ("NODE_FAIL", "BOOT_FAIL"):
        failure = analyse(job, "slurm", (state, 0), [None, None], lost=["n2"])
        assert failure.kind == JobOutcome.DIED and failure.host == "n2" and f"{state}: node n2 failed" in failure.line
        verdict = judge(failure, [], max_restarts=3, restarts=0)
        assert verdict.restart and verdict.exclude == {"n2"}, verdict.why
    failure = analyse(job, "slurm", ("NODE_FAIL", 0), [None, None])
    assert judge(failure, [], max_restarts=3, restarts=0).exclude == frozenset()

    def fake(command, **kwargs):  # scontrol's job line, then sinfo's node states
        out = "JobId=12 JobState=NODE_FAIL NodeList=n[1-2]" if command[0] == "scontrol" else "n1 idle\nn2 down\n"
        return subprocess.CompletedProcess(command, 0, stdout=out, stderr="")

    monkeypatch.setattr(job_end.subprocess, "run", fake)
    assert job_end.lost_nodes("12") == ["n2"]


def test_a_node_failure_srun_reports_in_a_job_that_outlives_it_blames_that_node(tmp_path):
    # A supervised job (sbatch --no-kill) loses only its step on the failed node; srun then kills the step's other
    # ranks and reports them killed too: the failed node is the cause, not the first rank reported.
    job = submitit.SlurmJob(tmp_path, "51", tasks=(0, 1))
    job.paths.stderr.write_text(
        "srun: error: Node failure on n2\nsrun: error: n1: task 0: Killed\nsrun: Force Terminated StepId=51.0\n"
    )
    failure = analyse(job, "slurm", ("", 0), [None, None])
    assert failure.kind == JobOutcome.DIED and failure.host == "n2" and "node n2 failed" in failure.line
    assert judge(failure, [], max_restarts=3, restarts=0).exclude == {"n2"}


def test_a_node_whose_slurmd_does_not_answer_is_blamed_for_the_step_that_could_not_start_there(tmp_path):
    # srun's words (the local cluster, 2026-12-05, slurmd of n3 killed inside the allocation): no rank started, so no
    # marker or result names anything; without this the step was LOST, restarted on the same nodes and LOST again.
    job = submitit.SlurmJob(tmp_path, "489", tasks=(0, 1))
    job.paths.stderr.write_text(
        "srun: error: Task launch for StepId=489.2 failed on node n3: Communication connection failure\n"
        "srun: error: Application launch failed: Communication connection failure\nsrun: Job step aborted\n"
    )
    failure = analyse(job, "slurm", ("", 0), [None, None])
    assert failure.kind == JobOutcome.DIED and failure.host == "n3" and failure.rank is None
    assert "node n3 could not start the step's tasks (Communication connection failure)" in failure.line
    assert judge(failure, [], max_restarts=3, restarts=0).exclude == {"n3"}
