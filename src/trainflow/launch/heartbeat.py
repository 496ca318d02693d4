"""Hang detection: every rank's heartbeat of liveness and step progress, watched inside the job, so a rank that stops
(SIGSTOP, a driver call that never returns, a dead peer that NCCL over RDMA cannot see) ends the job within
resilience.hang_detect_s instead of idling its whole allocation.

    with Heartbeat.start(runtime, resilience, rank=rank, world=world, paths=submitit.JobEnvironment().paths) as beat:
        Trainer(cfg, device, on_phase=beat.progress).train()

Each rank runs a daemon thread that, every `period_s`, publishes a beat in the job's heartbeat store (a TCPStore that
rank 0 serves for the heartbeat alone, on a free port it announces through torch.distributed's rendezvous store, so
4096 ranks' beats never queue behind the rendezvous): a counter, the step and the phase the rank's main thread last
reported, and its count of entered collectives per process group (resilience.hang.Beat, read back by read_beat: a beat
that does not read as one is no beat). The thread beats whatever the main
thread does, so a rank waiting in a collective keeps beating: a beat that stops means the process itself stopped.
Rank 0 seeds every rank's beat before any rank can publish, and reads them all in one round trip (multi_get) per
poll; the other ranks read rank 0's. Rank 0 declares a rank hung when
- its beat has not changed for the threshold (a stopped process; a rank that never published at all likewise), or
- ranks are alive but have made no progress for the threshold in a step phase (data, compute, eval; each of the
  main thread's markers is progress, so every evaluation batch is, and a long evaluation is no hang): then the
  collective counts name the rank the others wait for (resilience.hang.culprits), or nobody where every rank stands
  at the same collective (a symmetric hang: no host is blamed on a guess). Saves and loads are left to the
  collective timeout, as they may rightly take longer; or
- a rank has not finished its first step resilience.start_s after rank 0's heartbeat started, whatever it does (its
  start-up, load and first compile are no step phase, and a loop outside any collective leaves no count behind):
  blamed by the counts, else the one rank late where the others are not, else nobody.
The other ranks judge rank 0's silence only: rank 0 alone sees every rank's counts.
The threshold is config.resilience.hang_threshold_s: hang_detect_s, or, where that is 0, the larger of 60 s and 10 x
the median step so far. Clocks are never compared across hosts: staleness is how long the watcher itself has seen a
beat unchanged. A store that stops answering is rank 0 stopped: the others then judge it themselves.

On a verdict the detecting rank writes the diagnosis (hang.py: the rank, its host, step and phase, the evidence, and
the collective the detecting rank's own main thread is waiting in) and sets an abort key; every live rank then dumps
its Python stacks (and, over NCCL, PyTorch's Flight Recorder) beside the job's logs, counts itself done in the store
and exits with HANG_EXIT; rank 0, which serves the store, leaves last (or after a few beats), so no live rank's
stacks are cut off by the launcher ending the rest (srun --kill-on-bad-exit, executors.LocalController). The stage
names the hang in one line.

Each beat also carries the rank's median forward time (Heartbeat.timed, the trainer's on_step; train.clock), and rank
0 writes every rank's into <job>_timing.json as soon as every rank has timed a few steps, then once a minute, and
when it aborts: after a failure no rank is left to say who was slow, and a restart with
resilience.exclude_stragglers leaves the stragglers' hosts out (launch.restart).
"""

from __future__ import annotations

import contextlib
import datetime
import logging
import os
import statistics
import threading
import time
from collections import deque
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from submitit.core.utils import JobPaths

from trainflow.atomic import write_json
from trainflow.config import RuntimeConfig
from trainflow.config.resilience import ResilienceConfig, hang_threshold_s
from trainflow.host import hostname
from trainflow.launch.hang import HANG_EXIT, StacksWatchdog, collective_counts, dump_stacks, waiting_in, write_report
from trainflow.launch.task import mark_first_step
from trainflow.records import RecordError
from trainflow.resilience.hang import Beat, HangReport, culprits, read_beat
from trainflow.resilience.timing import RankTiming

log = logging.getLogger(__name__)

STEP_PHASES = ("data", "compute", "eval")
"""Phases whose progress is a step: a rank alive but stuck in one of them for the threshold is hung."""
TIMING_EVERY_S = 60.0
"""How often rank 0 writes every rank's forward time (one small file per job, however many ranks)."""
TIMING_FIRST_STEPS = 3
"""Rank 0 writes it first once every rank has timed this many steps: a job that fails in its first minute (at 70B,
a handful of steps) still says who was slow."""


@dataclass
class Seen:
    """What a watcher last saw of one rank, by its own clock."""

    counter: int = -1
    seen: float = field(default_factory=time.monotonic)
    """When the counter last changed."""
    step: int = -1
    phase: str = "start"
    marks: int = 0
    """How many progress markers its main thread had given."""
    moved: float = field(default_factory=time.monotonic)
    """When its main thread last gave a progress marker."""
    host: str = "?"
    forward_s: float = float("nan")
    """The rank's median forward over its last 50 steps."""
    steps: int = 0
    """The steps it has finished in this job, by its own count: a rank counts as stuck only once it has finished
    one (a count the watcher samples once a beat would miss a first step that took less than a beat)."""
    counts: dict[str, int] = field(default_factory=dict)
    """Its entered collectives per process group (resilience.hang)."""


NEVER = Beat().text()
"""The beat rank 0 seeds for every rank: one that never publishes stays at it and is reported silent."""
ABORT, DUMPED = "trainflow/abort", "trainflow/dumped"


def beat_key(rank: int) -> str:
    return f"trainflow/beat/{rank}"


class Heartbeat:
    def __init__(
        self, runtime: RuntimeConfig, resilience: ResilienceConfig, *, rank: int, world: int, paths: JobPaths, store
    ) -> None:
        self.rank, self.world, self.paths, self.store = rank, world, paths, store
        self.resilience, self.backend, self.period_s = resilience, runtime.backend, resilience.heartbeat_s
        self.step, self.phase, self.counter, self.marks = -1, "start", 0, 0
        self.step_started: float | None = None
        self.step_times: list[float] = []
        self.forward: deque[float] = deque(maxlen=50)
        self.first_marked = False
        self.timing_written, self.timings = time.monotonic(), 0
        self.beats = {r: Seen() for r in range(world)}
        self.started = time.monotonic()
        """When this rank's heartbeat started: a rank without a finished step past resilience.start_s is hung."""
        self.said: set[type] = set()
        self.unreadable: set[int] = set()
        """The ranks whose beat did not read as one, said once each."""
        self.stopped = threading.Event()
        self.thread = threading.Thread(target=self.run, name="trainflow-heartbeat", daemon=True)
        self.watchdog = StacksWatchdog(paths, rank)

    @classmethod
    @contextlib.contextmanager
    def start(
        cls,
        runtime: RuntimeConfig,
        resilience: ResilienceConfig,
        *,
        rank: int,
        world: int,
        paths: JobPaths,
        store: object = None,
    ) -> Iterator[Heartbeat]:
        """A running heartbeat for this rank (a single rank has no peer to wait for: it only beats). `store`: where
        the beats go instead of a store rank 0 serves (recovery from peers: its supervisor's, as rank 0 may die)."""
        if store is None:
            store = heartbeat_store(runtime, period_s=resilience.heartbeat_s, rank=rank, world=world)
        elif rank == 0:
            store.multi_set([beat_key(r) for r in range(world)], [NEVER] * world)
        beat = cls(runtime, resilience, rank=rank, world=world, paths=paths, store=store)
        beat.publish()
        beat.thread.start()
        try:
            yield beat
        finally:
            beat.stopped.set()
            beat.thread.join()
            beat.watchdog.close()

    def progress(self, phase: str, step: int) -> None:
        """The main thread's marker: it entered `phase` of `step` (the trainer's on_phase)."""
        now = time.monotonic()
        if phase == "data" and self.step_started is not None and step == self.step + 1:
            self.step_times = (self.step_times + [now - self.step_started])[-50:]
        if phase == "data":
            self.step_started = now
        self.step, self.phase, self.marks = step, phase, self.marks + 1

    def timed(self, record: object) -> None:
        """The trainer's on_step: this rank's forward seconds of the step (a StepRecord's forward_s); the first one's
        end goes into the task's marker (a hot restart's figure, launch.supervisor)."""
        if not self.first_marked:
            mark_first_step(self.paths)
            self.first_marked = True
        self.forward.append(record.forward_s)

    @property
    def threshold_s(self) -> float:
        return hang_threshold_s(self.resilience, statistics.median(self.step_times) if self.step_times else 0.0)

    def publish(self) -> None:
        self.watchdog.arm(self.threshold_s + 2 * self.period_s)  # a beat that does not come: the GIL held (hang.py)
        self.counter += 1
        forward = statistics.median(self.forward) if self.forward else None
        steps, counts = len(self.forward), collective_counts()
        beat = Beat(self.counter, self.step, self.phase, self.marks, hostname(), forward, steps, counts)
        self.store.set(beat_key(self.rank), beat.text())

    def run(self) -> None:
        unanswered = time.monotonic()
        while not self.stopped.wait(self.period_s):
            try:
                self.publish()
                if self.store.check([ABORT]):
                    self.abort(None)
                report = self.watch()
                unanswered = time.monotonic()
            except Exception as err:  # the store stopped answering: rank 0, which holds it, stopped
                if self.rank == 0:  # its own store: a fault of the watch itself, said once per kind
                    if type(err) not in self.said:
                        self.said.add(type(err))
                        log.warning("Heartbeat of rank 0 could not watch: %s: %s", type(err).__name__, err)
                    continue
                if time.monotonic() - unanswered < self.threshold_s:
                    continue
                report = self.report(0, self.beats[0], time.monotonic() - unanswered)
            if report is not None:
                self.abort(report)

    def watch(self) -> HangReport | None:
        """Rank 0 reads every rank's beat in one round trip, the others rank 0's; the verdict, or None. A rank without
        beats is the cause before any rank alive without progress (those wait for it); among those alive, the one
        the others' collective counts wait for, or none (rank 0 alone sees every rank's counts: the others judge its
        silence only)."""
        now, silent, stuck, late = time.monotonic(), {}, {}, {}
        ranks = list(range(self.world)) if self.rank == 0 else [0]
        for rank, text in zip(ranks, self.store.multi_get([beat_key(r) for r in ranks])):
            seen = self.observe(rank, text, now)
            silent[rank] = now - seen.seen
            started = seen.steps > 0  # its first step compiles, loads and warms up: resilience.start_s's to judge
            stuck[rank] = now - seen.moved if seen.phase in STEP_PHASES and started else 0.0
            late[rank] = 0.0 if started else now - self.started
        quiet = max(silent, key=silent.get)
        longest = max(stuck, key=stuck.get)
        if silent[quiet] > self.threshold_s or (
            silent[quiet] > 3 * self.period_s and stuck[longest] > self.threshold_s
        ):
            return self.report(quiet, self.beats[quiet], max(silent[quiet], stuck[longest]))
        progressing = any(now - b.moved < self.threshold_s for b in self.beats.values())  # the job is not hung yet
        if self.rank == 0 and stuck[longest] > self.threshold_s and not progressing:
            return self.stuck_report(longest, stuck[longest])
        if self.rank == 0 and (overdue := [r for r, s in late.items() if s > self.resilience.start_s]):
            return self.stuck_report(overdue[0], late[overdue[0]], late=overdue)
        if self.rank == 0 and self.timing_due(now):
            self.write_timing()
        return None

    def stuck_report(self, longest: int, seconds: float, *, late: list[int] = ()) -> HangReport:
        """Ranks alive without progress: the rank the collective counts name, else the one rank `late` (without a
        first step past resilience.start_s) where the others are not, else nobody."""
        evidence = culprits({r: b.counts for r, b in self.beats.items()})
        blamed = evidence.culprits[0] if evidence.culprits else None
        line = evidence.line()
        if blamed is None and len(late) == 1 < self.world:
            blamed, line = late[0], "it alone had not finished its first step"
        beat = self.beats[longest if blamed is None else blamed]
        limit = {"limit": "resilience.start_s", "threshold_s": self.resilience.start_s} if late else {}
        return self.report(blamed, beat, seconds, alive=True, evidence=line, **limit)

    def observe(self, rank: int, text: bytes, now: float) -> Seen:
        """Update what this watcher has seen of `rank` from its latest beat. A beat that does not read as one is no
        beat (said once a rank): the rank goes silent, and is reported so past the threshold."""
        seen = self.beats[rank]
        try:
            beat = read_beat(text, where=f"rank {rank}'s beat in the heartbeat store")
        except RecordError as err:
            if rank not in self.unreadable:
                self.unreadable.add(rank)
                log.warning("Heartbeat of rank %d left out a beat: %s", self.rank, err)
            return seen
        if beat.counter != seen.counter:
            seen.counter, seen.seen, seen.host, seen.steps = beat.counter, now, beat.host, beat.steps
            seen.forward_s = beat.forward if beat.forward is not None else float("nan")
            seen.counts = beat.counts
        if beat.marks != seen.marks:
            seen.step, seen.phase, seen.marks, seen.moved = beat.step, beat.phase, beat.marks, now
        return seen

    def timing_due(self, now: float) -> bool:
        first = not self.timings and all(b.steps >= TIMING_FIRST_STEPS for b in self.beats.values())
        return first or now - self.timing_written >= TIMING_EVERY_S

    def write_timing(self) -> None:
        self.timing_written, self.timings = time.monotonic(), self.timings + 1
        ranks = [RankTiming(r, b.host, b.forward_s, b.steps) for r, b in self.beats.items()]
        write_json(timing_path(self.paths), [t.to_json() for t in ranks])

    def report(self, rank: int | None, beat: Seen, seconds: float, **given: Any) -> HangReport:
        """The verdict on `rank` (None: nobody), a stopped one unless `given` says alive; `given` may add the evidence
        and the limit passed with its threshold (by default the hang threshold)."""
        return HangReport(
            rank=rank,
            host=beat.host if rank is not None else "",
            step=beat.step,
            phase=beat.phase,
            seconds=seconds,
            threshold_s=given.pop("threshold_s", self.threshold_s),
            detected_by=self.rank,
            waiting_in=waiting_in(threading.main_thread()),
            **{"alive": False, **given},
        )

    def abort(self, report: HangReport | None) -> None:
        """Write the diagnosis (the detecting rank), tell every rank, dump this rank's stacks and exit; rank 0, which
        serves the store, waits a few beats for the live ranks to dump theirs."""
        if report is not None and write_report(self.paths, report):
            log.error("Hang: %s", report.line())
            with contextlib.suppress(Exception):  # a stopped rank 0 holds the store: the others judge it themselves
                self.store.set(ABORT, str(report.rank))
        if self.rank == 0:
            with contextlib.suppress(OSError):  # the last word on who was slow; the stacks matter more
                self.write_timing()
        self.watchdog.cancel()
        dump_stacks(self.paths, self.rank, nccl=self.backend == "nccl")
        with contextlib.suppress(Exception):
            done = self.store.add(DUMPED, 1)
            deadline = time.monotonic() + 3 * self.period_s + 2
            while self.rank == 0 and done < self.world and time.monotonic() < deadline:
                time.sleep(min(self.period_s, 0.2))  # a stopped rank never counts itself: the deadline ends the wait
                done = self.store.add(DUMPED, 0)
        os._exit(HANG_EXIT)


def heartbeat_store(runtime: RuntimeConfig, *, period_s: float, rank: int, world: int) -> object:
    """The job's heartbeat store: rank 0 serves a TCPStore of its own on a free port, seeds every rank's beat and
    announces the port in torch.distributed's rendezvous store (MASTER_ADDR:MASTER_PORT); the others connect to it.
    Its short timeout is how a rank learns that rank 0 stopped."""
    import torch.distributed as dist

    address, port = os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"])
    wait = datetime.timedelta(seconds=runtime.collective_timeout_s)  # rank 0 may reach its heartbeat last
    short = datetime.timedelta(seconds=max(2 * period_s, 5))
    rendezvous = dist.TCPStore(address, port, is_master=False, timeout=wait)
    if rank == 0:
        store = dist.TCPStore(address, 0, is_master=True, wait_for_workers=False, timeout=short)
        store.multi_set([beat_key(r) for r in range(world)], [NEVER] * world)
        rendezvous.set("trainflow/heartbeat", str(store.port))
        return store
    return dist.TCPStore(address, int(rendezvous.get("trainflow/heartbeat")), is_master=False, timeout=short)


def timing_path(paths: JobPaths) -> Path:
    return paths.folder / f"{paths.job_id}_timing.json"
