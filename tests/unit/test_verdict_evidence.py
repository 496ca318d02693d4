"""Verdicts from node evidence (resilience.verdict, resilience.evidence, launch.judgement): each class of failure
judged from crafted rank logs (tracebacks as submitit records them) and crafted node evidence given through the
evidence source a test injects, as docs/fault-tolerance.md's table lists them; hostile node reports end in one clause
and never hang; the jobs ledger records the class and counts transient restarts apart."""

from __future__ import annotations

import json
import os
import time

import pytest
import submitit

from tests.conftest import make_config
from trainflow.launch.failure import exception_line
from trainflow.launch.judgement import REPORT_BYTES, judgement, node_evidence, recorded
from trainflow.launch.node_report import NodeReport, node_report_path, write_node_report
from trainflow.launch.task import TaskMarker, task_marker
from trainflow.records import RecordError
from trainflow.resilience.evidence import NodeEvidence, kernel_faults
from trainflow.resilience.ledger import FaultClass, JobOutcome, JobRun, standing
from trainflow.resilience.probation import NodeState
from trainflow.resilience.verdict import JobFailure, judge, suspects

HOSTS = ["nid001", "nid002"]
START = time.time() - 600
"""When the failed job's ranks started."""
AT = time.strftime("%Y-%m-%dT%H:%M:%S,000000+00:00", time.gmtime(START + 60))
"""A kernel log time after the job's start, as `dmesg --time-format iso` writes it."""
BEFORE = time.strftime("%Y-%m-%dT%H:%M:%S+0000", time.gmtime(START - 86400))
ILLEGAL = "torch.AcceleratorError: CUDA error: an illegal memory access was encountered"


def trace(exception: str) -> str:
    return f'Traceback (most recent call last):\n  File "/x/trainer.py", line 1, in step\n    f()\n{exception}\n'


def raised(exception: str, ranks: tuple[int, ...] = (0,)) -> JobFailure:
    """A job of 4 ranks, 2 a host, whose `ranks` raised `exception` (rank logs: their tracebacks)."""
    errors = {k: exception_line(trace(exception)) for k in ranks}
    hosts = {k: HOSTS[k // 2] for k in range(4)}
    return JobFailure(
        line="x", kind=JobOutcome.RAISED, rank=ranks[0], host=hosts[ranks[0]], errors=errors, world=4, hosts=hosts
    )


def source(kernel: dict[str, str], slurm: dict[str, str] | None = None):
    """The injected evidence source: each host's kernel log text, parsed as the real source parses it."""

    def evidence(hosts: list[str]) -> dict[str, NodeEvidence]:
        states = {h: NodeState(h, state) for h, state in (slurm or {}).items()}
        nvml = "not checked: NVML unavailable (no GPU here)"
        return {
            h: NodeEvidence(h, kernel_faults(kernel.get(h, ""), since=START), nvml, False, states.get(h)) for h in hosts
        }

    return evidence


def judged(failure: JobFailure, evidence, earlier=(), restarts: int = 0, transient: int = 0):
    found = evidence(sorted(suspects(failure)))
    return judge(failure, list(earlier), max_restarts=3, restarts=restarts, transient=transient, evidence=found)


def test_xid_present_blames_the_host():
    kernel = {"nid002": f"{AT} NVRM: Xid (PCI:0000:10:1c): 79, pid=123, GPU has fallen off the bus.\n"}
    verdict = judged(raised(ILLEGAL, ranks=(2,)), source(kernel))
    assert verdict.restart and verdict.exclude == {"nid002"} and verdict.fault == FaultClass.DEVICE
    assert "Xid (PCI:0000:10:1c): 79" in verdict.why and "\n" not in verdict.why
    # Slurm holding the node out (a site's health check drained it) confirms it too
    verdict = judged(raised(ILLEGAL, ranks=(2,)), source({}, {"nid002": "IDLE+DRAIN"}))
    assert verdict.exclude == {"nid002"} and verdict.fault == FaultClass.DEVICE


def test_xid_absent_blames_no_host():
    kernel = {
        "nid002": f"{AT} NVRM: Xid (PCI:0000:10:1c): 31, pid=123, MMU Fault\n"  # an application's Xid
        f"{BEFORE} NVRM: Xid (PCI:0000:10:1c): 63, Row Remapper: New row marked\n"  # before the job: stale
        f"NVRM: Xid (PCI:0000:10:1c): 79, no time stamp\n"
    }
    verdict = judged(raised(ILLEGAL, ranks=(2,)), source(kernel, {"nid002": "MIXED"}))
    assert verdict.restart and verdict.exclude == frozenset() and verdict.fault == FaultClass.UNCONFIRMED
    assert "no node's evidence confirms a device fault (nid002: no device Xid in its kernel log" in verdict.why
    assert "NVML not checked" in verdict.why


def test_nccl_system_error_restarts_blaming_no_host():
    nccl = "torch.distributed.DistBackendError: NCCL error in: ProcessGroupNCCL.cpp:2027, unhandled system error "
    failure = raised(nccl + "(run with NCCL_DEBUG=INFO for details), NCCL version 2.21.5 ncclSystemError", (0, 1, 2, 3))
    verdict = judged(failure, source({}), earlier=[failure])  # again in a second job: the network's, not the code
    assert verdict.restart and verdict.exclude == frozenset() and verdict.fault == FaultClass.NETWORK
    remote = raised("torch.distributed.DistBackendError: NCCL error: remote process exited (ncclRemoteError)")
    assert judged(remote, source({})).fault == FaultClass.NETWORK


@pytest.mark.parametrize(
    "error",
    [
        "OSError: [Errno 5] Input/output error: '/capstor/scratch/run/checkpoints/step-6/__0_0.distcp'",
        "OSError: [Errno 116] Stale file handle: '/lus/tokens/shard-00007.h5'",
    ],
)
def test_eio_is_transient(error):
    failure = raised(error, (0, 1, 2, 3))  # every rank at once: the file system's, not the code's
    verdict = judged(failure, source({}), earlier=[failure], transient=1)
    assert verdict.restart and verdict.exclude == frozenset() and verdict.fault == FaultClass.TRANSIENT
    assert verdict.why.startswith("transient restart 2 of 3")


def test_store_timeout_is_transient():
    store = "torch.distributed.DistStoreError: Timed out after 901 seconds waiting for clients. 1/4 clients joined."
    failure = raised(store, (1,))
    verdict = judged(failure, source({}), earlier=[failure, failure], restarts=3)  # other restarts used up
    assert verdict.restart and verdict.fault == FaultClass.TRANSIENT and verdict.exclude == frozenset()
    assert "not restarted" in judged(failure, source({}), transient=3).why


def test_everywhere_at_once_illegal_memory_access_is_code_restart_once_then_stop():
    kernel = {h: f"{AT} NVRM: Xid (PCI:0000:10:1c): 13, Graphics Exception\n" for h in HOSTS}
    every = raised(ILLEGAL, (0, 1, 2, 3))
    first = judged(every, source(kernel))
    assert first.restart and first.exclude == frozenset() and first.fault == FaultClass.CODE
    second = judged(every, source(kernel), earlier=[every])
    assert not second.restart and second.exclude == frozenset() and second.fault == FaultClass.CODE
    assert second.why == (
        f"not restarted: every rank raised {ILLEGAL!r} at once again and no node's evidence confirms a device fault, "
        "so the code fails wherever it runs"
    )


def report(job: submitit.Job, rank: int, host: str) -> None:
    paths = job.task(rank).paths
    paths.folder.mkdir(parents=True, exist_ok=True)
    task_marker(paths).write_text(json.dumps(TaskMarker(rank, host, 1, START).to_json()))


def test_hostile_node_reports_end_in_one_clause_and_never_hang(tmp_path):
    job = submitit.local.local.LocalJob(tmp_path, "9", tasks=(0, 1, 2))
    for rank, host in enumerate(["nid001", "nid002", "nid003"]):
        report(job, rank, host)
    xid = f"{AT} NVRM: Xid (PCI:0000:10:1c): 48, DBE\n"
    escape = NodeReport(f"\x1b[2J{xid}{AT} NVRM: Xid (PCI:0000:10:1c): 79,\x07 bell\n" * 3, "", "x\ny", False)
    node_report_path(job.task(0).paths).write_text(json.dumps(escape.to_json()))
    os.mkfifo(node_report_path(job.task(1).paths))  # a FIFO: refused, never waited on
    with open(node_report_path(job.task(2).paths), "w") as f:
        f.truncate(REPORT_BYTES + 1)  # past the bound: not read
    started = time.monotonic()
    found = node_evidence(job, lambda hosts: {})(["nid001", "nid002", "nid003"])
    assert time.monotonic() - started < 1
    assert found["nid001"].kernel == [] and found["nid001"].nvml == "x?y"  # control characters: no line counts
    assert "is a FIFO, not a regular file" in found["nid002"].unread[0] and not found["nid002"].confirms
    assert f"holds more than {REPORT_BYTES} bytes" in found["nid003"].unread[0] and not found["nid003"].confirms
    assert all(e.line().isprintable() for e in found.values())
    node_report_path(job.task(0).paths).write_text(json.dumps(NodeReport(xid, "", "healthy", False).to_json()))
    assert node_evidence(job, lambda hosts: {})(["nid001"])["nid001"].confirms


def test_the_judgement_is_prepared_once_with_an_injected_source_and_recorded(tmp_path):
    cfg = make_config("train_segment", tmp_path)
    job = submitit.local.local.LocalJob(tmp_path, "9", tasks=(0, 1, 2, 3))
    kernel = {"nid001": f"{AT} NVRM: Xid (PCI:0000:10:1c): 94, Contained ECC error\n"}
    verdict = judgement(cfg, job, raised(ILLEGAL, (1,)), [], [], evidence=source(kernel))
    assert verdict.exclude == {"nid001"} and verdict.fault == FaultClass.DEVICE
    run = recorded(JobRun(0, 0, "9", 0.0, 0.0, 1.0, JobOutcome.RAISED), verdict)
    assert (run.left_out, run.fault, run.verdict) == (["nid001"], FaultClass.DEVICE, verdict.why)


def test_a_rank_s_node_report_reads_back_from_this_host(tmp_path):
    """The writer a raising rank calls, on this machine: its real kernel log (or why none was read) and NVML's word
    (here: not checked, no GPU), read back through the evidence source; nothing here confirms a fault."""
    job = submitit.local.local.LocalJob(tmp_path, "9", tasks=(0,))
    report(job, 0, "nid001")
    write_node_report(job.task(0).paths)
    evidence = node_evidence(job, lambda hosts: {})(["nid001"])["nid001"]
    assert evidence.nvml.startswith(("not checked", "healthy")) and evidence.line().isprintable()


def test_transient_restarts_are_counted_apart_and_a_format_1_ledger_reads():
    def run(n: int, fault: FaultClass | None) -> JobRun:
        return JobRun(0, n, str(n), 0.0, 0.0, 1.0, JobOutcome.RAISED, checkpoint=4, fault=fault)

    jobs = [run(0, FaultClass.TRANSIENT), run(1, FaultClass.TRANSIENT), run(2, FaultClass.UNCONFIRMED), run(3, None)]
    now = standing(jobs)
    assert (now.without_progress, now.transient) == (1, 2)
    old = {k: v for k, v in run(0, None).to_json().items() if k != "fault"} | {"format": 1}
    assert JobRun.from_json(old).fault is None
    assert JobRun.from_json(run(0, FaultClass.CODE).to_json()).fault == FaultClass.CODE
    with pytest.raises(RecordError, match="not one of input, ended"):
        JobRun.from_json({**run(0, None).to_json(), "fault": "gremlins"})


def test_a_peer_s_loss_in_two_jobs_is_no_code_fault():
    """Rank 0's gloo error is rank 1's consequence (a port apart in each job): only the failing rank's own exception
    is compared across jobs, so two different CUDA errors no node confirms are both restarted (found by the CUDA drill,
    tests/integration/test_restarts.py)."""

    def job(port: int, cuda: str) -> JobFailure:
        lost = f"RuntimeError: [pair.cc:553] Connection closed by peer [127.0.0.1]:{port}"
        return JobFailure(line="x", kind=JobOutcome.RAISED, rank=1, host="nid001", errors={0: lost, 1: cuda}, world=4)

    first, second = job(41167, ILLEGAL), job(52011, "torch.AcceleratorError: CUDA error: uncorrectable ECC error")
    verdict = judged(second, source({}), earlier=[first])
    assert verdict.restart and verdict.fault == FaultClass.UNCONFIRMED and verdict.exclude == frozenset()
    assert "the same exception in two jobs" in judged(first, source({}), earlier=[first]).why
