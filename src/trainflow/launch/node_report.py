"""What a rank that raises a device or interconnect error writes of its host as it ends (launch.task): the tail of
its kernel log and NVML's health of its GPUs (<job>_<rank>_node.json beside its task marker), the part of a failed
job's node evidence (resilience.evidence) only the host itself can read; launch.judgement reads it back.

    write_node_report(submitit.JobEnvironment().paths)
"""

from __future__ import annotations

import subprocess
from dataclasses import dataclass
from pathlib import Path

from submitit.core.utils import JobPaths

from trainflow.atomic import write_json
from trainflow.energy.nvml import NodeGpus
from trainflow.records import Record

KERNEL_COMMANDS = (("dmesg", "--time-format", "iso"), ("journalctl", "-k", "-q", "--no-pager", "-o", "short-iso"))
"""How a rank reads its host's kernel log, the first that answers (dmesg is refused where kernel.dmesg_restrict is 1;
the journal then, for members of systemd-journal or adm)."""
KERNEL_S = 10
"""The longest either may take."""
KERNEL_TAIL_BYTES = 1 << 20
"""The kernel log's tail a report keeps: a GPU's Xids of the last hour fit many times over."""


@dataclass(frozen=True)
class NodeReport(Record):
    """What a rank that raised a device or interconnect error saw of its host as it ended (<job>_<rank>_node.json)."""

    kernel: str
    """The tail of its host's kernel log ("" where none could be read)."""
    kernel_unread: str
    """Why the kernel log could not be read ("" where it was)."""
    nvml: str
    """NVML's word: "healthy", the faults found, or why it was not checked."""
    nvml_fault: bool


def node_report_path(paths: JobPaths) -> Path:
    return paths.folder / f"{paths.job_id}_{paths.task_id}_node.json"


def write_node_report(paths: JobPaths) -> None:
    """Record this rank's host's kernel log tail and NVML's health (a rank that raised a device or interconnect
    error, as it ends: launch.task)."""
    kernel, unread = kernel_log()
    nvml, fault = nvml_health()
    write_json(node_report_path(paths), NodeReport(kernel, unread, nvml, fault).to_json())


def kernel_log() -> tuple[str, str]:
    """The tail of this host's kernel log, or "" and why none could be read."""
    why = []
    for command in KERNEL_COMMANDS:
        try:
            done = subprocess.run(command, capture_output=True, timeout=KERNEL_S, stdin=subprocess.DEVNULL)
        except (OSError, subprocess.TimeoutExpired) as err:
            why.append(f"{command[0]}: {type(err).__name__}")
            continue
        if done.returncode == 0 and done.stdout:
            return done.stdout[-KERNEL_TAIL_BYTES:].decode("utf-8", errors="replace"), ""
        why.append(f"{command[0]}: exit {done.returncode} {done.stderr[:120].decode('utf-8', errors='replace')!r}")
    return "", "kernel log not read (" + "; ".join(why) + ")"


def nvml_health() -> tuple[str, bool]:
    """NVML's word on this host's GPUs, and whether it names a fault."""
    gpus, why_not = NodeGpus.open()
    if gpus is None:
        return f"not checked: {why_not}", False
    try:
        faults = gpus.faults()
    finally:
        gpus.close()
    return ("; ".join(faults), True) if faults else ("healthy", False)
