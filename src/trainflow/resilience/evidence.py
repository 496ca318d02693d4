"""Node evidence: what a host of a failed job says of its own GPUs, which alone makes a device error the device's
(resilience.verdict: a CUDA error on a host without it is no device fault, and blames nobody).

    evidence = NodeEvidence("nid001", kernel=kernel_faults(text, since=job_start), nvml="healthy", slurm=state)

Three sources, each read where it can be and said where it cannot (`unread`), none trusted to be well formed:
- the kernel log (dmesg, or the journal's kernel lines, in ISO time): NVIDIA's driver writes each device event as
  `NVRM: Xid (PCI:0000:10:1c): 79, ...`. Every Xid since the job started confirms a device fault but those NVIDIA's
  Xid catalog gives an application as a possible cause (APPLICATION_XIDS: what a kernel bug's illegal memory access
  leaves behind), and so does the driver's "fallen off the bus". Parsed strictly: only whole printable lines of that
  form with a time at or after the job's start count (a row remapping of last week confirms nothing), at most
  KERNEL_LINES of them, each cut to LINE_CHARS;
- NVML's health of the host's GPUs (energy.nvml.NodeGpus.health: uncorrected ECC errors, retired pages pending, a GPU
  lost), where nvidia-ml-py and a GPU exist ("not checked" in one clause where not);
- Slurm's record of the node (resilience.probation.NodeState): held out of jobs (drained, down, failed) confirms it.
"""

from __future__ import annotations

import datetime
import re
from collections.abc import Callable
from dataclasses import dataclass, field

from trainflow.resilience.probation import NodeState

XID = re.compile(r"NVRM: Xid \((?:PCI:)?[0-9A-Fa-f:.]+\): (\d{1,4}),")
"""The driver's line for a device event (its catalog number after the PCI address)."""
OFF_THE_BUS = re.compile(r"NVRM: GPU .{0,80}has fallen off the bus")
APPLICATION_XIDS = frozenset({13, 31, 43, 45})
"""Xids NVIDIA's catalog (docs.nvidia.com/deploy/xid-errors) lists a user application among the causes of (13 graphics
engine exception, 31 memory page fault, 43 GPU stopped processing) or that follow an earlier error (45 preemptive
cleanup): an out-of-bounds kernel writes them on a healthy GPU, so they confirm nothing."""
KERNEL_TIME = re.compile(r"(\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d)(?:[,.]\d{1,9})?(Z|[+-]\d\d:?\d\d) ")
"""A kernel log line's time, as `dmesg --time-format iso` and `journalctl -o short-iso` write it."""
KERNEL_LINES = 8
LINE_CHARS = 200


def kernel_faults(text: str, *, since: float) -> list[str]:
    """The kernel log's lines in `text` that confirm a device fault at or after `since` (time.time()), oldest first,
    the newest KERNEL_LINES; anything else in `text` (other lines, control characters, lines without a time) is
    passed over."""
    found: list[str] = []
    for line in text.splitlines():
        if not line.isprintable() or not (at := KERNEL_TIME.match(line)) or logged_at(at) < since:
            continue
        xid = XID.search(line)
        if (xid and int(xid[1]) not in APPLICATION_XIDS) or (not xid and OFF_THE_BUS.search(line)):
            found.append(line[:LINE_CHARS])
    return found[-KERNEL_LINES:]


def logged_at(match: re.Match) -> float:
    """The time a kernel log line's stamp names; -inf where it names none (a day 31 of February)."""
    zone = "+00:00" if match[2] == "Z" else match[2] if ":" in match[2] else f"{match[2][:3]}:{match[2][3:]}"
    try:
        return datetime.datetime.fromisoformat(match[1] + zone).timestamp()
    except ValueError:
        return float("-inf")


@dataclass(frozen=True)
class NodeEvidence:
    """What a host of a failed job says of its own devices."""

    host: str
    kernel: list[str] = field(default_factory=list)
    """Its kernel log's lines that confirm a device fault since the job started (kernel_faults)."""
    nvml: str = "not checked"
    """NVML's word on its GPUs: "healthy", the faults found, or why it was not checked."""
    nvml_fault: bool = False
    slurm: NodeState | None = None
    """Slurm's record of the node (None: not asked, or not known to Slurm)."""
    unread: list[str] = field(default_factory=list)
    """Each source that could not be read, and why (one clause each)."""

    @property
    def confirms(self) -> bool:
        """The node confirms a device fault."""
        return bool(self.kernel) or self.nvml_fault or (self.slurm is not None and not self.slurm.in_service)

    def line(self) -> str:
        """The evidence in one clause."""
        kernel = f"kernel log: {self.kernel[-1]!r}" if self.kernel else "no device Xid in its kernel log"
        slurm = f"Slurm {self.slurm.line()}" if self.slurm else "Slurm not asked"
        unread = f"; {'; '.join(self.unread)}" if self.unread else ""
        return f"{self.host}: {kernel}; NVML {self.nvml}; {slurm}{unread}"


def clause(text: str, chars: int = LINE_CHARS) -> str:
    """`text` fit for one line: cut to `chars`, each character that is not printable (a newline, an escape) a '?'."""
    return "".join(c if c.isprintable() else "?" for c in text[:chars])


EvidenceSource = Callable[[list[str]], dict[str, NodeEvidence]]
"""The evidence of each of the hosts named (launch.judgement.node_evidence gathers it; a test gives what it needs)."""


def summary(evidence: dict[str, NodeEvidence], hosts: set[str], most: int = 3) -> str:
    """The evidence of `hosts` in one clause: the first `most` hosts', then how many more."""
    lines = [evidence[h].line() if h in evidence else f"{h}: no evidence gathered" for h in sorted(hosts)]
    more = f" (and {len(lines) - most} more hosts)" if len(lines) > most else ""
    return " | ".join(lines[:most]) + more
