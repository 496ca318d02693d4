"""A hung job's report (written by the heartbeat's detecting rank beside the job's logs, read by the failure's
analysis), the beat each rank publishes in the job's heartbeat store (launch.heartbeat), and the evidence the report
blames from: every rank's count of the collectives it has entered on each of its process groups, published with its
beat (launch.hang.collective_counts).

    python -c "from trainflow.resilience.hang import culprits; print(culprits({0: {'1': 7}, 1: {'1': 6}}))"

torch.distributed numbers the collectives of each process group on every member (gloo and NCCL alike: the count a
rank has issued, `ProcessGroup._get_sequence_number_for_group`, which the Flight Recorder's analyser also reads). In a
hang, a rank that has entered collective n + 1 of a group waits for every member still at n. The ranks that others
wait for and that wait for nobody are the cause; a chain (A waits in a pipeline's collective for B, which waits for
C) ends at them. Where every rank stands at the same count of every group (each inside the same collective, or a
symmetric stall: a failed link or switch), the evidence names nobody, and no host is blamed on a guess.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field

from trainflow.records import Record, RecordError, fields_added

BEAT_BYTES = 1 << 16
"""More than any beat holds (a rank belongs to a few process groups): a bigger one is not read."""


@dataclass(frozen=True)
class HangReport(Record):
    FORMAT = 2
    MIGRATIONS = {1: fields_added}  # 2: limit

    rank: int | None
    """The rank the job waited for; None where the evidence names nobody (a symmetric hang)."""
    host: str
    """Its host ("" where no rank is blamed)."""
    step: int
    phase: str
    """What the hung rank last reported doing (data, compute, eval, save, load, start)."""
    seconds: float
    """How long the detecting rank saw it silent (or, alive, without progress)."""
    alive: bool
    """True: it kept beating but its step stopped (a stuck collective); False: it stopped beating (a stopped
    process, or one stuck in a driver call)."""
    threshold_s: float
    detected_by: int
    waiting_in: str
    """The collective the detecting rank's main thread was waiting in, and the trainflow code that called it."""
    evidence: str = ""
    """For a rank alive without progress: what the ranks' collective counts showed (resilience.hang)."""
    limit: str = "resilience.hang_detect_s"
    """The setting whose threshold it passed: the hang threshold, or resilience.start_s for a rank that never finished
    its first step."""

    def line(self) -> str:
        past = f"past {self.limit} ({self.threshold_s:.0f} s"
        waited = f"rank {self.detected_by} waited in {self.waiting_in}"
        if self.rank is None:
            return (
                f"every rank made no progress for {self.seconds:.0f} s (step {self.step}), {past}): "
                f"{self.evidence}, so no host is blamed; {waited}"
            )
        what = "made no progress" if self.alive else "stopped responding"
        why = (
            f"a stuck main thread: {self.evidence}"
            if self.alive
            else "a stopped process, or one stuck in a driver call"
        )
        return (
            f"rank {self.rank} on host {self.host} {what} for {self.seconds:.0f} s (its last beat: step {self.step}, "
            f"{self.phase}), {past}: {why}); {waited}"
        )


@dataclass(frozen=True)
class Beat(Record):
    """One rank's beat in the job's heartbeat store (launch.heartbeat). The defaults are the beat rank 0 seeds for
    every rank: one that never publishes stays at it. Any process that reaches the store's port can write to it, so a
    watcher reads a beat with read_beat, which trusts nothing in it."""

    counter: int = -1
    """One more each beat: a counter that stops means the process stopped."""
    step: int = -1
    phase: str = "start"
    """What the rank's main thread last reported doing (data, compute, eval, save, load; start before any)."""
    marks: int = 0
    """How many progress markers its main thread had given."""
    host: str = "?"
    forward: float | None = None
    """The rank's median forward seconds over its last steps (train.clock); None before its first."""
    steps: int = 0
    """The steps it has finished in this job."""
    counts: dict[str, int] = field(default_factory=dict)
    """Its entered collectives per process group (culprits reads them)."""

    def text(self) -> str:
        return json.dumps(self.to_json())


def read_beat(text: bytes | str, *, where: str) -> Beat:
    """The beat a store value holds; one RecordError naming `where` for anything else (too big, no JSON, no beat)."""
    if len(text) > BEAT_BYTES:
        raise RecordError(f"{where} holds {len(text)} bytes, more than a beat's {BEAT_BYTES}; it was not read")
    try:
        data = json.loads(text)
    except (ValueError, RecursionError) as err:
        raise RecordError(f"{where} is not JSON ({type(err).__name__}); it was not read") from None
    return Beat.from_json(data, where=where)


@dataclass(frozen=True)
class Evidence:
    """What the counts say: the ranks at fault (empty: nobody), and for the first of them the collective it has not
    entered while the most ranks wait in it."""

    culprits: tuple[int, ...]
    group: str = ""
    collective: int = 0
    """The sequence number of the collective the culprit has not entered."""
    waiting: tuple[int, ...] = ()
    """The ranks waiting in it."""

    def line(self) -> str:
        if not self.culprits:
            return "every rank had entered as many collectives of each group as its peers (a symmetric hang)"
        ranks = ", ".join(map(str, self.waiting))
        return (
            f"it had not entered collective {self.collective} of process group {self.group}, in which rank"
            f"{'s' * (len(self.waiting) > 1)} {ranks} waited"
        )


def culprits(counts: dict[int, dict[str, int]]) -> Evidence:
    """The ranks the others wait for, from each rank's collective counts per group (`counts[rank][group]`)."""
    members: dict[str, dict[int, int]] = {}
    for rank, groups in counts.items():
        for group, count in groups.items():
            members.setdefault(group, {})[rank] = count
    waits_for: dict[int, set[int]] = {rank: set() for rank in counts}
    awaited: dict[int, list[tuple[str, int, tuple[int, ...]]]] = {}
    for group, seen in members.items():
        ahead = max(seen.values())
        waiting = tuple(sorted(r for r, c in seen.items() if c == ahead))
        for rank, count in seen.items():
            if count < ahead:
                awaited.setdefault(rank, []).append((group, count + 1, waiting))
                for waiter in waiting:
                    waits_for[waiter].add(rank)
    found = tuple(sorted(r for r in awaited if not waits_for[r]))
    if not found:
        return Evidence(())
    group, collective, waiting = min(awaited[found[0]], key=lambda a: (-len(a[2]), a[0]))  # the most waiters
    return Evidence(found, group, collective, waiting)
