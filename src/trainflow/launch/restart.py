"""The files of a run folder a restart reads for the hosts to leave out: the gate's nccl-exclude.txt and a failed
job's timing file (its stragglers). Whether to restart, and the failed host, are resilience.verdict's.

    exclude = gate_exclusions(RunFolder.of(cfg).nccl_exclude) | straggler_hosts(job.paths, 1.5)
"""

from __future__ import annotations

import contextlib
import json
from pathlib import Path

from submitit.core.utils import JobPaths

from trainflow.launch.heartbeat import timing_path
from trainflow.records import RecordError
from trainflow.resilience.ledger import checked_hosts
from trainflow.resilience.timing import RankTiming, stragglers


def gate_exclusions(path: str | Path) -> frozenset[str]:
    """The hosts validate_nccl's gate wrote to leave out (nccl-exclude.txt, comma-separated); none when absent."""
    path = Path(path)
    if not path.is_file():
        return frozenset()
    hosts = [h.strip() for h in path.read_text(errors="replace").replace("\n", ",").split(",") if h.strip()]
    return checked_hosts(hosts, str(path))


def straggler_hosts(paths: JobPaths, factor: float) -> frozenset[str]:
    """The hosts of the ranks a failed job's heartbeat last timed as stragglers (launch.heartbeat's timing file);
    none when it wrote none (a job shorter than a minute) or one that does not read."""
    path = timing_path(paths)
    timings: list[RankTiming] = []
    with contextlib.suppress(OSError, ValueError, TypeError, RecordError):
        timings = [RankTiming.from_json(t, where=str(path)) for t in json.loads(path.read_text())]
    return checked_hosts({t.host for t in stragglers(timings, factor)}, str(path))
