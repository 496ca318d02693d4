"""Failures at a rate (fault.mtbf_s, fault.seed): a seeded Poisson process on the campaign's own clock, which every
segment, job and restart continues, and its ledger of the failures that struck (faults.jsonl, beside the checkpoints).

    python -m trainflow.stages.train_segment fault.mtbf_s=60 fault.seed=3

The process's clock starts once per campaign: train_segment writes a START line into faults.jsonl before its first
job (`start_clock`), and every later job, restart and segment reads it back, so the arrival times are a pure function
of (seed, MTBF, that start) and a restarted job meets the same process, not a fresh one. The clock is cut into
windows of fault.mtbf_s each: window k holds a Poisson number (mean 1) of arrivals placed uniformly in it, all drawn
from a generator seeded by (seed, k), which is a Poisson process of rate 1 / fault.mtbf_s; so a job finds the
arrivals due to it in O(1) per window from its own start, however long the campaign has run (drawing every gap since
the campaign's start took one draw per arrival: at fault.mtbf_s=1e-9, for ever). Each is a stalled rank (STALL) with
probability cluster.hardware.hang_share, else a killed one (KILL), on a rank drawn uniformly from the job's world.

It strikes only while a job holds its ranks, the time the planner's failures strike in (trainflow.plan.failures):
from a restart's ranks loading the job's code (its start-up and load are at risk), and in a segment's first job
from its first step (the start-up and load of a planned job start are not). An arrival in between (a queue, a
detection, the gap between segments) strikes nobody: dropping a Poisson process's arrivals over some stretches leaves
a Poisson process of the same rate on the rest. The rank it names strikes at its next step boundary
(trainflow.train.faults.maybe_arrive), and appends the failure to the ledger first.
"""

from __future__ import annotations

import itertools
import math
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
restart's ranks are at risk from here, about where its task marker ends the queue (resilience.goodput)."""


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


@dataclass(frozen=True)
class Process:
    """The campaign's arrival process: its clock's start, its mean gap, seed and hang share, over a world of ranks."""

    started: float
    mtbf_s: float
    seed: int
    hang_share: float
    world: int

    def window(self, k: int) -> list[Arrival]:
        """The arrivals of window k, [started + k * mtbf_s, started + (k + 1) * mtbf_s), in order."""
        rng = np.random.default_rng([self.seed, k])
        count = int(rng.poisson(1.0))
        times = np.sort(self.started + (k + rng.random(count)) * self.mtbf_s)
        stalls, ranks = rng.random(count) < self.hang_share, rng.integers(self.world, size=count)
        return [
            Arrival(float(t), ArrivalKind.STALL if stall else ArrivalKind.KILL, int(rank), **self.settings)
            for t, stall, rank in zip(times, stalls, ranks)
        ]

    @property
    def settings(self) -> dict[str, float]:
        return {"mtbf_s": self.mtbf_s, "seed": self.seed, "hang_share": self.hang_share}

    def after(self, since: float) -> Iterator[Arrival]:
        """The arrivals from `since` on, in order, without end: from its window, never from the campaign's start."""
        for k in itertools.count(max(0, math.floor((since - self.started) / self.mtbf_s))):
            yield from (a for a in self.window(k) if a.time >= since)


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

    process: Process
    rank: int
    opens: float | None
    """When the job's ranks are at risk (a restart: IMPORTED); None: from the first step boundary."""
    ledger: Path
    host: str
    segment: int
    pending: Iterator[Arrival] | None = None
    """The process from `opens` on, once that is known."""
    next: Arrival | None = None

    def due(self, step: int, now: float | None = None) -> Arrival | None:
        """The failure this rank must strike with at this step boundary, written to the ledger; None for none. Every
        arrival before the job was at risk, or due to another rank, passes by."""
        now = time.time() if now is None else now
        if self.pending is None:
            self.opens = now if self.opens is None else self.opens
            self.pending = self.process.after(self.opens)
        mine = None
        while True:
            self.next = next(self.pending) if self.next is None else self.next
            if self.next.time > now:
                break
            if mine is None and self.next.rank == self.rank:
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
        process = Process(start.time, fault.mtbf_s, fault.seed, start.hang_share, world)
        opens = IMPORTED if attempt else None
        return cls(process, rank, opens, ledger, hostname(), segment)


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
