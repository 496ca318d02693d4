"""Failures at a rate (fault.mtbf_s, fault.seed): a seeded Poisson process on the campaign's own clock, which every
segment, job and restart continues, and its ledger of the failures that struck (faults.jsonl, beside the checkpoints).

    python -m trainflow.stages.train_segment fault.mtbf_s=60 fault.seed=3

The process's clock starts once per campaign: train_segment writes a START line into faults.jsonl before its first
job (`start_clock`), and every later job, restart and segment reads it back, so the arrival times are a pure function
of (seed, MTBF, that start) and a restarted job meets the same process, not a fresh one. Arrival k comes at start +
the sum of k exponential gaps of mean fault.mtbf_s; it is a stalled rank (STALL) with probability
cluster.hardware.hang_share, else a killed one (KILL), on a rank drawn uniformly from the job's world.

It strikes only while a job holds its ranks, the time the planner's failures strike in (trainflow.plan.failures):
from a restart's ranks loading the job's code (its start-up and load are at risk), and in a segment's first job
from its first step (the start-up and load of a planned job start are not). An arrival in between (a queue, a
detection, the gap between segments) strikes nobody: dropping a Poisson process's arrivals over some stretches leaves
a Poisson process of the same rate on the rest. The rank it names strikes at its next step boundary
(trainflow.train.faults.maybe_arrive), and appends the failure to the ledger first.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from dataclasses import dataclass
from enum import StrEnum
from pathlib import Path

import numpy as np

from trainflow.config import FaultConfig
from trainflow.errors import TrainflowError
from trainflow.host import hostname
from trainflow.journal import Journal
from trainflow.records import Record
from trainflow.resilience.ledger import JobRun

IMPORTED = time.time()
"""When the rank's process loaded the job's code (unpickling the job imports the trainer, which imports this): a
restart's ranks are at risk from here, about where its task marker ends the queue (train.goodput)."""


class ArrivalKind(StrEnum):
    START = "start"
    """The campaign's clock started (no failure)."""
    KILL = "KILL"
    """A dead rank: SIGKILL."""
    STALL = "STALL"
    """A hung rank: its main thread blocks for good while its heartbeat beats on (the stall drill)."""


@dataclass(frozen=True)
class Arrival(Record):
    """One line of faults.jsonl: the process's START, or a failure that struck."""

    time: float
    """Wall-clock time (time.time()): the clock's start, or when the failure was due."""
    kind: ArrivalKind
    rank: int = -1
    host: str = ""
    segment: int = -1
    step: int = -1
    """The step boundary it struck at."""
    mtbf_s: float = 0.0
    seed: int = 0
    hang_share: float = 0.0


def schedule(*, started: float, mtbf_s: float, seed: int, hang_share: float, world: int) -> Iterator[Arrival]:
    """The process's arrivals in order, without end: a pure function of its arguments."""
    rng = np.random.default_rng(seed)
    due = started
    while True:
        due += float(rng.exponential(mtbf_s))
        kind = ArrivalKind.STALL if rng.random() < hang_share else ArrivalKind.KILL
        yield Arrival(due, kind, int(rng.integers(world)), mtbf_s=mtbf_s, seed=seed, hang_share=hang_share)


def clock(ledger: Path, *, mtbf_s: float, seed: int) -> Arrival | None:
    """The newest START of this MTBF and seed in the ledger (a drill with other settings starts its own)."""
    starts = [a for a in Journal(ledger, Arrival).read() if a.kind is ArrivalKind.START]
    return next((a for a in reversed(starts) if (a.mtbf_s, a.seed) == (mtbf_s, seed)), None)


def start_clock(ledger: Path, *, mtbf_s: float, seed: int, hang_share: float) -> float:
    """The campaign's clock: the ledger's START, written now where it has none for these settings."""
    if (start := clock(ledger, mtbf_s=mtbf_s, seed=seed)) is None:
        start = Arrival(time.time(), ArrivalKind.START, mtbf_s=mtbf_s, seed=seed, hang_share=hang_share)
        Journal(ledger, Arrival).append(start)
    return start.time


@dataclass
class Arrivals:
    """One rank's view of the process in one job: the failures due to it, each once."""

    pending: Iterator[Arrival]
    rank: int
    opens: float | None
    """When the job's ranks are at risk (a restart: IMPORTED); None: from the first step boundary."""
    ledger: Path
    host: str
    segment: int
    next: Arrival | None = None

    def due(self, step: int, now: float | None = None) -> Arrival | None:
        """The failure this rank must strike with at this step boundary, written to the ledger; None for none. Every
        arrival before the job was at risk, or due to another rank, passes by."""
        now = time.time() if now is None else now
        if self.opens is None:
            self.opens = now
        mine = None
        while True:
            self.next = next(self.pending) if self.next is None else self.next
            if self.next.time > now:
                break
            if mine is None and self.next.time >= self.opens and self.next.rank == self.rank:
                mine = self.next
            self.next = None
        if mine is None:
            return None
        struck = Arrival(
            mine.time, mine.kind, self.rank, self.host, self.segment, step, mine.mtbf_s, mine.seed, mine.hang_share
        )
        Journal(self.ledger, Arrival).append(struck)
        return struck

    @classmethod
    def for_job(
        cls, fault: FaultConfig, *, ledger: Path, rank: int, world: int, attempt: int, segment: int
    ) -> Arrivals | None:
        """This rank's arrivals in this job (None: fault.mtbf_s is 0), on the clock train_segment started."""
        if not fault.mtbf_s:
            return None
        start = clock(ledger, mtbf_s=fault.mtbf_s, seed=fault.seed)
        if start is None:
            raise TrainflowError(
                f"{ledger} has no START line for fault.mtbf_s={fault.mtbf_s:g} fault.seed={fault.seed}: train_segment "
                "writes it before its first job; run the segment through train_segment"
            )
        pending = schedule(
            started=start.time, mtbf_s=fault.mtbf_s, seed=fault.seed, hang_share=start.hang_share, world=world
        )
        opens = IMPORTED if attempt else None
        return cls(pending, rank, opens, ledger, hostname(), segment)


def drilled_hosts(ledger: Path, jobs: list[JobRun]) -> frozenset[str]:
    """The hosts the jobs ledger blames only for failures this process injected (a struck arrival on that host while
    the blamed job ran): healthy hosts a drill killed or stalled a rank on. A hot restart leaves such a host out of its
    job (the spare's drill), but later jobs may use it again, as they would a repaired node: on a few nodes, a campaign
    of a few failures would otherwise run out of hosts."""
    struck = [a for a in Journal(ledger, Arrival).read() if a.kind is not ArrivalKind.START]

    def injected(job: JobRun, host: str) -> bool:
        return any(a.host == host and job.submitted <= a.time <= job.ended for a in struck)

    blames = [(host, injected(job, host)) for job in jobs for host in job.left_out]
    return frozenset(h for h, _ in blames) - {h for h, drilled in blames if not drilled}
