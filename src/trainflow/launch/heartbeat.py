"""Hang detection: every rank's heartbeat of liveness and step progress, watched inside the job, so a rank that stops
(SIGSTOP, a driver call that never returns, a dead peer that NCCL over RDMA cannot see) ends the job within
cluster.runtime.hang_detect_s instead of idling its whole allocation.

    with Heartbeat.start(runtime, rank=rank, world=world, paths=submitit.JobEnvironment().paths) as beat:
        Trainer(cfg, device, on_phase=beat.progress).train()

Each rank runs a daemon thread that, every `period_s`, publishes a beat in the job's own key-value store (a TCPStore
client of the one torch.distributed set up at MASTER_ADDR:MASTER_PORT): a counter, the step and the phase the rank's
main thread last reported, and when it did. The thread beats whatever the main thread does, so a rank waiting in a
collective keeps beating: a beat that stops means the process itself stopped. Rank 0's thread reads every rank's
beat (the other ranks read rank 0's) and declares a rank hung when
- its beat has not changed for the threshold (a stopped process), or
- it is alive but its step has not moved for the threshold in a step phase (data, compute, eval: a stuck collective);
  saves and loads are left to the collective timeout, as they may rightly take longer.
The threshold is config.cluster.hang_threshold_s: hang_detect_s, or, where that is 0, the larger of 60 s and 10 x the
median step so far. Clocks are
never compared across hosts: staleness is how long the watcher itself has seen a beat unchanged. A store that stops
answering is rank 0 stopped: the others then judge it themselves.

On a verdict the detecting rank writes the diagnosis (hang.py: the rank, its host, step and phase, and the
collective the detecting rank's own main thread is waiting in) and sets an abort key; every live rank then dumps
its Python stacks (and, over NCCL, PyTorch's Flight Recorder) beside the job's logs and exits with HANG_EXIT. The
launcher ends the rest (srun --kill-on-bad-exit, executors.LocalController) and the stage names the hang in one line.

Each beat also carries the rank's median forward time (Heartbeat.timed, the trainer's on_step; train.clock), and rank
0 writes every rank's into <job>_timing.json as soon as every rank has timed a few steps, then once a minute, and
when it aborts: after a failure no rank is left to say who was slow, and a restart with
cluster.allocation.exclude_stragglers leaves the stragglers' hosts out (launch.restart).
"""

from __future__ import annotations

import contextlib
import datetime
import json
import logging
import os
import statistics
import threading
import time
from collections import deque
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

from submitit.core.utils import JobPaths

from trainflow.atomic import write_json
from trainflow.config import RuntimeConfig
from trainflow.config.cluster import hang_threshold_s
from trainflow.energy.node import hostname
from trainflow.launch.hang import HANG_EXIT, HangReport, dump_stacks, waiting_in, write_report
from trainflow.train.summary import RankTiming

log = logging.getLogger(__name__)

STEP_PHASES = ("data", "compute", "eval")
"""Phases whose progress is a step: a rank alive but stuck in one of them for the threshold is hung."""
TIMING_EVERY_S = 60.0
"""How often rank 0 writes every rank's forward time (one small file per job, however many ranks)."""
TIMING_FIRST_STEPS = 3
"""Rank 0 writes it first once every rank has timed this many steps: a job that fails in its first minute (at 70B,
a handful of steps) still says who was slow."""


@dataclass
class Beat:
    """What a watcher last saw of one rank, by its own clock."""

    counter: int = -1
    seen: float = field(default_factory=time.monotonic)
    """When the counter last changed."""
    step: int = -1
    phase: str = "start"
    moved: float = field(default_factory=time.monotonic)
    """When the step (or phase) last changed."""
    first_step: int | None = None
    """The first step the rank reported: a rank counts as stuck only once it has finished a step (the first one
    compiles, loads and warms up for as long as it takes)."""
    host: str = "?"
    forward_s: float = float("nan")
    """The rank's median forward over its last 50 steps."""
    steps: int = 0


class Heartbeat:
    def __init__(self, runtime: RuntimeConfig, *, rank: int, world: int, paths: JobPaths, store: object) -> None:
        self.rank, self.world, self.paths, self.store = rank, world, paths, store
        self.runtime, self.backend = runtime, runtime.backend
        self.period_s = runtime.heartbeat_s
        self.step, self.phase, self.counter = -1, "start", 0
        self.step_started: float | None = None
        self.step_times: list[float] = []
        self.forward: deque[float] = deque(maxlen=50)
        self.timing_written, self.timings = time.monotonic(), 0
        self.beats = {r: Beat() for r in range(world)}
        self.stopped = threading.Event()
        self.thread = threading.Thread(target=self.run, name="trainflow-heartbeat", daemon=True)

    @classmethod
    @contextlib.contextmanager
    def start(cls, runtime: RuntimeConfig, *, rank: int, world: int, paths: JobPaths) -> Iterator[Heartbeat]:
        """A running heartbeat for this rank (a single rank has no peer to wait for: it only beats)."""
        import torch.distributed as dist

        store = dist.TCPStore(
            os.environ["MASTER_ADDR"],
            int(os.environ["MASTER_PORT"]),
            is_master=False,
            timeout=datetime.timedelta(seconds=max(2 * runtime.heartbeat_s, 5)),
        )
        beat = cls(runtime, rank=rank, world=world, paths=paths, store=store)
        beat.publish()
        beat.thread.start()
        try:
            yield beat
        finally:
            beat.stopped.set()
            beat.thread.join()

    def progress(self, phase: str, step: int) -> None:
        """The main thread's marker: it entered `phase` of `step` (the trainer's on_phase)."""
        now = time.monotonic()
        if phase == "data" and self.step_started is not None and step == self.step + 1:
            self.step_times = (self.step_times + [now - self.step_started])[-50:]
        if phase == "data":
            self.step_started = now
        self.step, self.phase = step, phase

    def timed(self, record: object) -> None:
        """The trainer's on_step: this rank's forward seconds of the step (a StepRecord's forward_s)."""
        self.forward.append(record.forward_s)

    @property
    def threshold_s(self) -> float:
        return hang_threshold_s(self.runtime, statistics.median(self.step_times) if self.step_times else 0.0)

    def publish(self) -> None:
        self.counter += 1
        forward = statistics.median(self.forward) if self.forward else None
        beat = {"counter": self.counter, "step": self.step, "phase": self.phase, "host": hostname()}
        beat.update(forward=forward, steps=len(self.forward))
        self.store.set(f"trainflow/beat/{self.rank}", json.dumps(beat))

    def run(self) -> None:
        unanswered = time.monotonic()
        while not self.stopped.wait(self.period_s):
            try:
                self.publish()
                if self.store.check(["trainflow/abort"]):
                    self.abort(None)
                report = self.watch()
                unanswered = time.monotonic()
            except Exception:  # the store stopped answering: rank 0, which holds it, stopped
                if self.rank == 0 or time.monotonic() - unanswered < self.threshold_s:
                    continue
                report = self.report(0, self.beats[0], time.monotonic() - unanswered)
            if report is not None:
                self.abort(report)

    def watch(self) -> HangReport | None:
        """Rank 0 reads every rank's beat, the others rank 0's; the hung rank, or None. A rank without beats is the
        cause before any rank alive without progress (those wait for it); among those, the one furthest behind."""
        now, silent, stuck = time.monotonic(), {}, {}
        for rank in range(self.world) if self.rank == 0 else [0]:
            seen = self.observe(rank, json.loads(self.store.get(f"trainflow/beat/{rank}")), now)
            silent[rank] = now - seen.seen
            started = seen.first_step is not None and seen.step > seen.first_step
            stuck[rank] = now - seen.moved if seen.phase in STEP_PHASES and started else 0.0
        quiet = max(silent, key=silent.get)
        if silent[quiet] > self.threshold_s or (
            silent[quiet] > 3 * self.period_s and max(stuck.values()) > self.threshold_s
        ):
            return self.report(quiet, self.beats[quiet], max(silent[quiet], max(stuck.values())))
        if over := [r for r, seconds in stuck.items() if seconds > self.threshold_s]:
            behind = min(over, key=lambda r: (self.beats[r].step, r))
            return self.report(behind, self.beats[behind], stuck[behind], alive=True)
        if self.rank == 0 and self.timing_due(now):
            self.write_timing()
        return None

    def observe(self, rank: int, beat: dict, now: float) -> Beat:
        """Update what this watcher has seen of `rank` from its latest beat."""
        seen = self.beats[rank]
        if beat["counter"] != seen.counter:
            seen.counter, seen.seen, seen.host, seen.steps = beat["counter"], now, beat["host"], beat["steps"]
            seen.forward_s = beat["forward"] if beat["forward"] is not None else float("nan")
        if (beat["step"], beat["phase"]) != (seen.step, seen.phase):
            seen.step, seen.phase, seen.moved = beat["step"], beat["phase"], now
            if seen.first_step is None and seen.phase in STEP_PHASES:
                seen.first_step = seen.step
        return seen

    def timing_due(self, now: float) -> bool:
        first = not self.timings and all(b.steps >= TIMING_FIRST_STEPS for b in self.beats.values())
        return first or now - self.timing_written >= TIMING_EVERY_S

    def write_timing(self) -> None:
        self.timing_written, self.timings = time.monotonic(), self.timings + 1
        ranks = [RankTiming(r, b.host, b.forward_s, b.steps) for r, b in self.beats.items()]
        write_json(timing_path(self.paths), [t.to_json() for t in ranks])

    def report(self, rank: int, beat: Beat, seconds: float, *, alive: bool = False) -> HangReport:
        return HangReport(
            rank=rank,
            host=beat.host,
            step=beat.step,
            phase=beat.phase,
            seconds=seconds,
            alive=alive,
            threshold_s=self.threshold_s,
            detected_by=self.rank,
            waiting_in=waiting_in(threading.main_thread()),
        )

    def abort(self, report: HangReport | None) -> None:
        """Write the diagnosis (the detecting rank), tell every rank, dump this rank's stacks and exit."""
        if report is not None and write_report(self.paths, report):
            log.error("Hang: %s", report.line())
            with contextlib.suppress(Exception):  # a stopped rank 0 holds the store: the others judge it themselves
                self.store.set("trainflow/abort", str(report.rank))
        if self.rank == 0:
            with contextlib.suppress(OSError):  # the last word on who was slow; the stacks matter more
                self.write_timing()
        dump_stacks(self.paths, self.rank, nccl=self.backend == "nccl")
        os._exit(HANG_EXIT)


def timing_path(paths: JobPaths) -> Path:
    return paths.folder / f"{paths.job_id}_timing.json"
