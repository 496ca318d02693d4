"""A job's start-up at the campaign's world size W: the sum of its parts (config.startup.StartupPart), each a law fitted
to the drills' measured parts (cluster.hardware.startup), which the goodput plan takes as startup_s and hot_restart_s
unless the cluster sets them.

    python -m trainflow.plan experiment=llama70b_alps      # "Start-up": each part, its law and its label

- verdict (a hot restart's only), launch, imports, build: constants. The launch is per job step (srun), the
  allocation's wait apart (requeue_wait_s); imports and build per process, so W ranks reading one venv at once on a
  shared file system, which a constant does not see, is an assumption of the preset.
- rendezvous: a + b W: rank 0's TCPStore is one server every rank connects to.
- communicators: a + b log2(W): each group's set-up a tree's depth.
- load: a + b W, the load's own cost (DCP's plan gathered on its coordinator, the metadata every rank reads): the
  checkpoint's bytes are the plan's load term (plan.scenarios.load_times), not counted again here.
- first step: one step of the plan and a (warm-up, communicators made at their first collective). So the sum, as the
  drills measure it, ends with the first step's end: R then holds that step, which the campaign's steps hold too.

A start-up with no verdict is a new job's (startup_s); with it, a hot restart's (hot_restart_s). A drill of 2 ranks
fits the constants; the per-rank and per-doubling terms are the preset's assumptions until a run at scale measures
the parts (cluster.measured names each part a run at the campaign's scale measured).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from trainflow.config.cluster import HardwareConfig
from trainflow.config.startup import PartLaw, StartupPart
from trainflow.records import Record


@dataclass(frozen=True)
class PartFigure(Record):
    """One part of the start-up at the campaign's world size."""

    part: StartupPart
    seconds: float
    law: str
    """The law with its terms at this world size, as printed ("0.8 s + 0.001 s x 4096 ranks")."""
    measured: str = ""
    """Where a run at the campaign's scale measured it (cluster.measured); empty: not measured at scale."""


@dataclass(frozen=True)
class StartupPlan(Record):
    """startup_s and hot_restart_s as the goodput plan takes them, and the parts they sum where the model gives them."""

    world: int
    startup_s: float
    hot_restart_s: float
    startup_set: bool
    """cluster.hardware.startup_s is set: it overrides the parts' sum."""
    hot_restart_set: bool
    """cluster.hardware.hot_restart_s is set: it overrides the parts' sum."""
    fitted: str = ""
    """Where the laws' constants were measured (cluster.hardware.startup.fitted); empty: no model."""
    parts: list[PartFigure] = field(default_factory=list)

    def summed(self, *, hot: bool) -> float:
        return parts_sum(self.parts, hot=hot)


def parts_sum(parts: list[PartFigure], *, hot: bool) -> float:
    """A hot restart's start-up (every part), or a new job's (every part but the supervisor's verdict)."""
    return sum(p.seconds for p in parts if hot or p.part is not StartupPart.VERDICT)


def law_terms(law: PartLaw, *, world: int) -> list[tuple[float, str]]:
    """(seconds, as printed) of each term of `law` at `world` ranks: its constant, then its scale terms where set."""
    terms = [(law.seconds, f"{law.seconds:.3g} s")]
    if law.per_rank_s:
        terms.append((law.per_rank_s * world, f"{law.per_rank_s:.3g} s x {world} ranks"))
    if law.per_doubling_s:
        terms.append((law.per_doubling_s * math.log2(world), f"{law.per_doubling_s:.3g} s x log2 {world}"))
    return terms


def part_figure(part: StartupPart, law: PartLaw, *, world: int, step_s: float, measured: str) -> PartFigure:
    """`part` at `world` ranks (the first step's with one step of `step_s`)."""
    terms = law_terms(law, world=world)
    if part is StartupPart.FIRST_STEP:
        terms.append((step_s, f"one step {step_s:.3g} s"))
    return PartFigure(part, sum(s for s, _ in terms), " + ".join(text for _, text in terms), measured)


def plan_startup(h: HardwareConfig, measured: dict[str, str], *, world: int, step_s: float) -> StartupPlan:
    """The start-up of `world` ranks on hardware `h` (`measured`: cluster.measured), each sum overridden where set."""
    parts = []
    if h.startup is not None:
        parts = [
            part_figure(p, h.startup.law(p), world=world, step_s=step_s, measured=measured.get(p.value, ""))
            for p in StartupPart
        ]
    return StartupPlan(
        world=world,
        startup_s=parts_sum(parts, hot=False) if h.startup_s is None else h.startup_s,
        hot_restart_s=parts_sum(parts, hot=True) if h.hot_restart_s is None else h.hot_restart_s,
        startup_set=h.startup_s is not None,
        hot_restart_set=h.hot_restart_s is not None,
        fitted=h.startup.fitted if h.startup is not None else "",
        parts=parts,
    )
