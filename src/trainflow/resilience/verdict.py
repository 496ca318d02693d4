"""Whether a failed training job is worth a new one, and which hosts the new one leaves out.

    history = standing(jobs)                                          # the run's jobs ledger, at a segment's start
    verdict = judge(failure, earlier, max_restarts=3, restarts=history.without_progress, evidence=found)

Each failure is put in one class (resilience.ledger.FaultClass, recorded in jobs.jsonl; docs/fault-tolerance.md's
table names each class's test), by the ranks' exceptions and the nodes' own evidence (resilience.evidence):
- a rank that died (a signal, the OOM killer, a lost node) or hung with a culprit (launch.heartbeat): HOST, a new job
  on other hosts resumes from the newest verified checkpoint, the failing rank's host left out;
- a device or interconnect error (CUDA, ECC, Xid, NCCL's) on a host whose own evidence confirms a device fault (a
  device Xid in its kernel log, NVML's health, Slurm holding it out): DEVICE, that host left out;
- a store timeout (DistStoreError, a rendezvous or TCPStore timeout) or a file-system error (EIO, ESTALE, Lustre's):
  TRANSIENT, restarted with no host blamed, counted apart from the other restarts (Standing.transient);
- NCCL's system or remote error, or any other NCCL error, with no node's evidence: NETWORK, no host blamed (checking
  the job's nodes inside the allocation is the in-allocation check's, not built yet);
- the same exception on every rank at once with no node's evidence: CODE, no host blamed, restarted once; the same
  again stops the stage. An exception on some ranks no node confirms (a CUDA error among them): UNCONFIRMED, restarted
  with no host blamed; the same exception in two jobs is CODE and stops it.
What a restart cannot fix ends the stage at once, in one line saying why: one of trainflow's own errors on any rank
(INPUT: a config value, a data file, a checkpoint that fails verification with no older one to fall back to); a job
Slurm or an operator ended (ENDED: CANCELLED, DEADLINE; a TIMEOUT whose requeues ran out), or whose time limit came
more often than cluster.allocation.max_requeues allows; running out of device memory at the same step twice (MEMORY).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from trainflow.resilience.evidence import NodeEvidence, summary
from trainflow.resilience.ledger import FaultClass, JobOutcome, checked_hosts


@dataclass(frozen=True, kw_only=True)
class JobFailure:
    line: str
    """The one line naming the cause, the job and a log file."""
    kind: JobOutcome
    """HANG, STOPPED, DIED, RAISED or LOST (never COMPLETED): what the jobs ledger records as the job's outcome."""
    state: str = ""
    """Slurm's final state ("" for a local job)."""
    rank: int | None = None
    host: str = ""
    step: int | None = None
    """The step the failing rank was at, where known."""
    errors: dict[int, str] = field(default_factory=dict)
    """Each rank that raised: its exception line."""
    expected: bool = False
    """A rank raised one of trainflow's own errors (TrainflowError): the cause is the input, not the machine."""
    world: int = 0
    """The job's ranks."""
    hosts: dict[int, str] = field(default_factory=dict)
    """Each rank's host, where its task marker says."""


NOT_RESTARTED_STATES = frozenset({"CANCELLED", "DEADLINE", "TIMEOUT"})


REQUEUES_USED_UP = re.compile(r"UncompletedJobError: .*timed-out too many times")
"""submitit's error where the pre-timeout signal came once more than cluster.allocation.max_requeues allows."""


OUT_OF_MEMORY = re.compile(r"out of memory|OutOfMemoryError", re.IGNORECASE)


DEVICE_FAULT = re.compile(
    r"CUDA error|CUDA driver error|cudaError|CUBLAS_STATUS_(?!SUCCESS)|CUDNN_STATUS_|\bECC\b|uncorrectable|\bXid\b|"
    r"NVML_ERROR|GPU is lost|fell off the bus",
    re.IGNORECASE,
)
"""An exception of the device or its driver (GPU and HBM faults were 52 % of Llama 3's 419 interruptions); a kernel
bug's illegal memory access raises one too, so only the node's evidence makes it the device's."""


NETWORK_FAULT = re.compile(r"NCCL error|nccl\w*Error|NCCL communicator was aborted", re.IGNORECASE)
"""An exception of the collectives' transport (ncclSystemError, ncclRemoteError...): the faulty peer is rarely the
rank that raises."""


TRANSIENT_FAULT = re.compile(
    r"DistStoreError|RendezvousTimeoutError|(?:TCPStore|rendezvous|store)\b.{0,120}(?:timed out|timeout)|"
    r"\[Errno (?:5|116)\]|Input/output error|Stale file handle|\bE(?:IO|STALE)\b|Lustre",
    re.IGNORECASE,
)
"""A store timeout (the rendezvous' or the heartbeat's TCPStore) or a file-system error (EIO, ESTALE, Lustre's): the
service's, gone once it recovers; no rank's host is at fault."""


@dataclass(frozen=True)
class Verdict:
    restart: bool
    why: str
    """Why (not): one clause, for the log and the failure line."""
    exclude: frozenset[str] = frozenset()
    """The hosts the failure blames: every later job of the run leaves them out (JobRun.left_out)."""
    fault: FaultClass | None = None
    """What the failure was taken for (JobRun.fault)."""


def judge(
    failure: JobFailure,
    earlier: list[JobFailure],
    *,
    max_restarts: int,
    restarts: int,
    transient: int = 0,
    slow: frozenset[str] = frozenset(),
    evidence: dict[str, NodeEvidence] | None = None,
) -> Verdict:
    """Restart after `failure` (the failures before it in this segment: `earlier`), or not, and why; a restart leaves
    out the hosts the failure's class blames and the stragglers' hosts `slow` (resilience.exclude_stragglers).
    `restarts` / `transient`: the restarts in a row without progress, other / transient (Standing); `evidence`: the
    failed job's hosts' own (launch.judgement.node_evidence)."""
    if failure.expected:
        why = "not restarted: trainflow refused an input, which a new job would refuse again"
        return Verdict(False, why, fault=FaultClass.INPUT)
    if failure.state in NOT_RESTARTED_STATES:
        why = f"not restarted: Slurm ended the job ({failure.state}), which a new job would not undo"
        return Verdict(False, why, fault=FaultClass.ENDED)
    if any(REQUEUES_USED_UP.search(text) for text in failure.errors.values()):
        why = (
            "not restarted: the job met its time limit more often than cluster.allocation.max_requeues allows "
            "(raise it, or cluster.allocation.time_min)"
        )
        return Verdict(False, why, fault=FaultClass.ENDED)
    fault, blamed, note = classify(failure, earlier, evidence or {})
    if note.startswith("not restarted"):
        return Verdict(False, note, fault=fault)
    used = transient if fault == FaultClass.TRANSIENT else restarts
    exclude = blamed | slow
    kind = "transient " if fault == FaultClass.TRANSIENT else ""
    if used >= max_restarts:
        why = (
            f"not restarted: resilience.max_restarts({max_restarts}) used up (that many {kind}restarts in a row saved "
            f"no newer checkpoint){note}"
        )
        return Verdict(False, why, exclude, fault)
    left_out = f", leaving out {', '.join(sorted(exclude))}" if exclude else ""
    return Verdict(True, f"{kind}restart {used + 1} of {max_restarts}{left_out}{note}", exclude, fault)


def classify(
    failure: JobFailure, earlier: list[JobFailure], evidence: dict[str, NodeEvidence]
) -> tuple[FaultClass, frozenset[str], str]:
    """The failure's class, the hosts it blames, and a note for the verdict's line (one that begins "not restarted"
    where the class itself stops the stage)."""
    confirmed = {host for host in suspects(failure) if host in evidence and evidence[host].confirms}
    if confirmed:
        found = summary(evidence, confirmed)
        return FaultClass.DEVICE, host_blame(failure) | checked_hosts(confirmed, "node evidence"), f" ({found})"
    if failure.kind in (JobOutcome.HANG, JobOutcome.DIED):
        return FaultClass.HOST, host_blame(failure), ""
    texts = failure.errors.values()
    if any(TRANSIENT_FAULT.search(text) for text in texts):
        return FaultClass.TRANSIENT, frozenset(), " (a store timeout or a file-system error: no host blamed)"
    asked = suspects(failure)
    unconfirmed = "no node's evidence confirms a device fault" + (f" ({summary(evidence, asked)})" if asked else "")
    if any(NETWORK_FAULT.search(text) for text in texts):
        return FaultClass.NETWORK, frozenset(), f" (an NCCL error, no host blamed: {unconfirmed})"
    if everywhere := at_once(failure):
        if any(at_once(f) == everywhere for f in earlier):
            why = f"not restarted: every rank raised {everywhere!r} at once again and no node's evidence confirms a "
            return FaultClass.CODE, frozenset(), why + "device fault, so the code fails wherever it runs"
        return FaultClass.CODE, frozenset(), f" (once: every rank raised {everywhere!r} at once, no host blamed)"
    if oom := any(OUT_OF_MEMORY.search(text) for text in texts):
        if failure.step is not None and any(_oom_at(f, failure.step) for f in earlier):
            why = f"not restarted: out of memory at step {failure.step} twice (python -m trainflow.plan)"
            return FaultClass.MEMORY, frozenset(), why
    same = causes(failure) & {s for f in earlier for s in causes(f)}
    if failure.kind == JobOutcome.RAISED and same:
        why = f"not restarted: a rank raised the same exception in two jobs ({min(same)!r}) and {unconfirmed}"
        return FaultClass.CODE, frozenset(), why + ", so the code fails"
    if oom:
        return FaultClass.MEMORY, frozenset(), " (out of memory, no host blamed)"
    if failure.kind == JobOutcome.RAISED:
        return FaultClass.UNCONFIRMED, frozenset(), f" (no host blamed: {unconfirmed})"
    return FaultClass.HOST, host_blame(failure), ""


def suspects(failure: JobFailure) -> set[str]:
    """The hosts whose evidence may make the failure a device fault: those of the ranks that raised a device or
    interconnect error, and a dead or hung rank's."""
    own = {failure.rank: failure.host} if failure.rank is not None else {}
    hosts = {**own, **failure.hosts}
    raised = {hosts.get(r, "") for r, text in failure.errors.items() if DEVICE_FAULT.search(text)}
    raised |= {hosts.get(r, "") for r, text in failure.errors.items() if NETWORK_FAULT.search(text)}
    if failure.kind in (JobOutcome.HANG, JobOutcome.DIED):
        raised.add(failure.host)
    return raised - {""}


def host_blame(failure: JobFailure) -> frozenset[str]:
    """A dead rank's host, or a hung one's the heartbeat named, or a failed node."""
    failed = {failure.host} if failure.kind in (JobOutcome.HANG, JobOutcome.DIED) and failure.host else set()
    return checked_hosts(failed, "the failed job's task marker or hang report")


def signature(line: str) -> str:
    """An exception line with its numbers and addresses masked (each rank's message names its own), cut short."""
    return re.sub(r"0x[0-9a-fA-F]+|\d+", "N", line)[:200]


def signatures(failure: JobFailure) -> set[str]:
    return {signature(text) for text in failure.errors.values()}


def causes(failure: JobFailure) -> set[str]:
    """The failing rank's exception, masked (all the ranks' where none is named): the others' are mostly its
    consequence (a peer's loss), the same in every job whatever the cause."""
    own = failure.errors.get(failure.rank) if failure.rank is not None else None
    return {signature(own)} if own else signatures(failure)


def at_once(failure: JobFailure) -> str:
    """The exception every rank of the job raised at once ('' where not every rank raised the same one)."""
    raised = signatures(failure)
    return next(iter(raised)) if len(failure.errors) == failure.world > 0 and len(raised) == 1 else ""


def _oom_at(failure: JobFailure, step: int) -> bool:
    return failure.step == step and any(OUT_OF_MEMORY.search(text) for text in failure.errors.values())
