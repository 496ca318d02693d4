"""Which rank a hung job waits for, from evidence: every rank's count of the collectives it has entered on each of its
process groups, published with its heartbeat (launch.heartbeat).

    python -c "from trainflow.launch.blame import culprits; print(culprits({0: {'1': 7}, 1: {'1': 6}}))"

torch.distributed numbers the collectives of each process group on every member (gloo and NCCL alike: the count a
rank has issued, `ProcessGroup._get_sequence_number_for_group`, which the Flight Recorder's analyser also reads). In a
hang, a rank that has entered collective n + 1 of a group waits for every member still at n. The ranks that others
wait for and that wait for nobody are the cause; a chain (A waits in a pipeline's collective for B, which waits for
C) ends at them. Where every rank stands at the same count of every group (each inside the same collective, or a
symmetric stall: a failed link or switch), the evidence names nobody, and no host is blamed on a guess.

Pipeline groups are left out: their point-to-point sends and receives count on the two ranks of each transfer only,
so their members' counts differ without anyone waiting (DeviceMesh names them `mesh_pp`).
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass

POINT_TO_POINT = frozenset({"mesh_pp"})
"""Process-group descriptions (DeviceMesh's `mesh_<dim>`) whose members' counts differ in normal running."""


def collective_counts() -> dict[str, int]:
    """This rank's count of entered collectives per process group it belongs to (pipeline groups left out); {} before
    torch.distributed is set up. Read from the heartbeat's thread while the main thread may be creating groups."""
    import torch.distributed as dist

    if not dist.is_initialized():
        return {}
    world = dist.distributed_c10d._world  # the registry of process groups; no public accessor lists them
    counts = {}
    with contextlib.suppress(RuntimeError):  # a group added while this copies the registry: the next beat has it
        for group, name in list(world.pg_names.items()):
            if getattr(group, "group_desc", "") in POINT_TO_POINT:
                continue
            with contextlib.suppress(RuntimeError, AttributeError):  # a backend that keeps no count
                counts[name] = group._get_sequence_number_for_group()
    return counts


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
