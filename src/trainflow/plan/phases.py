"""The plan of a campaign in phases (config.phases): each phase's plan, its config composed as the phase's jobs compose
it (phase=<name>), and the campaign's total.

    python -m trainflow.plan experiment=llama70b_alps_campaign
    python -m trainflow.plan experiment=llama70b_alps_campaign phase=long_context     # one phase, as a plain plan

The total adds the phases' steps, tokens, hours (steps and the checkpoint saves blocking them), facility energy and
the failures they expect as configured. Its goodput is the phases' as configured weighted by their wall time under
failures (each phase's productive time over its goodput): kept steps over the wall time of the whole campaign. Energy
and hours are the plan's without failures, as each phase's plan gives them. A phase that cannot run as planned (a
local world this machine cannot hold, a plan that does not fit, a campaign that cannot finish: plan.build.refusal) is
refused in one line naming it, and nothing is printed: a total that includes it would plan a campaign that stops there.
"""

from __future__ import annotations

import shlex
from collections.abc import Sequence
from dataclasses import dataclass

from trainflow.config import compose
from trainflow.errors import ConfigError
from trainflow.plan.build import Plan, build_plan, refusal
from trainflow.plan.table import render
from trainflow.records import Record


@dataclass(frozen=True)
class Figures(Record):
    """A phase's, or the whole campaign's, headline figures."""

    steps: int
    tokens: int
    hours: float
    """Steps and the checkpoint saves blocking them (plan.campaign), without failures."""
    facility_mwh: float
    failures: float
    """Failures expected as configured."""
    goodput: float
    """Kept steps' share of the wall time as configured (the simulated mean)."""
    wall_hours: float
    """The wall time under failures as configured: the productive time over the goodput."""

    @classmethod
    def of(cls, plan: Plan) -> Figures:
        camp, g = plan.campaign, plan.goodput
        assert g is not None  # a plan that does not fit is refused before its figures are read
        s = g.configured
        return cls(
            steps=camp.steps,
            tokens=camp.tokens,
            hours=camp.hours,
            facility_mwh=camp.facility_gwh * 1e3,
            failures=s.failures,
            goodput=s.simulated,
            wall_hours=g.productive_s / s.simulated / 3600,
        )

    @classmethod
    def total(cls, parts: Sequence[Figures]) -> Figures:
        """The sums, and the goodput weighted by wall time (module docstring)."""
        wall = sum(p.wall_hours for p in parts)
        return cls(
            steps=sum(p.steps for p in parts),
            tokens=sum(p.tokens for p in parts),
            hours=sum(p.hours for p in parts),
            facility_mwh=sum(p.facility_mwh for p in parts),
            failures=sum(p.failures for p in parts),
            goodput=sum(p.goodput * p.wall_hours for p in parts) / wall,
            wall_hours=wall,
        )


@dataclass(frozen=True)
class PhasePlan(Record):
    name: str
    series: str
    """The checkpoint series the phase trains (config.phases)."""
    figures: Figures
    plan: Plan
    measured: dict[str, str]
    """The phase's cluster.measured: which goodput inputs a run at scale measured (plan.table)."""


@dataclass(frozen=True)
class PhasesPlan(Record):
    phases: list[PhasePlan]
    total: Figures


def chooses_phase(overrides: Sequence[str]) -> bool:
    """Whether the overrides name one phase (phase=<name>): then it is planned alone, as a plain plan."""
    return any(w.partition("=")[0].lstrip("+~") == "phase" for w in overrides)


def plan_phases(overrides: Sequence[str], names: Sequence[str]) -> PhasesPlan:
    """The plan of each phase `names` lists, under `overrides`; one ConfigError naming the first that cannot run."""
    phases = []
    for i, name in enumerate(names):
        cfg = compose("train_segment", [*overrides, f"phase={name}"])
        plan = build_plan(cfg)
        if why := refusal(cfg, plan):
            alone = shlex.join(["python", "-m", "trainflow.plan", *overrides, f"phase={name}"])
            raise ConfigError(f"phase {name}: {why} (its plan alone: {alone})")
        phases.append(PhasePlan(name, cfg.phases[i].series, Figures.of(plan), plan, dict(cfg.cluster.measured)))
    return PhasesPlan(phases=phases, total=Figures.total([p.figures for p in phases]))


def render_phases(campaign: PhasesPlan) -> str:
    """Each phase's plan as plan.table renders it, then the campaign's figures by phase and in total."""
    n, lines = len(campaign.phases), []
    for i, p in enumerate(campaign.phases, 1):
        lines += [f"== Phase {i} of {n}: {p.name} (series {p.series}) ==", "", render(p.plan, p.measured)]
    head = (
        f"  {'phase':<14} {'steps':>9} {'tokens':>10} {'days':>7} {'energy MWh':>10} {'failures':>8} {'goodput':>7} "
        f"{'wall days':>9}"
    )
    lines += [
        f"Campaign of {n} phases (days and energy without failures; failures and goodput as configured, the total's "
        "goodput weighted by each phase's wall time under failures)",
        head,
        *(figure_line(p.name, p.figures) for p in campaign.phases),
        figure_line("total", campaign.total),
    ]
    return "\n".join(lines) + "\n"


def figure_line(name: str, f: Figures) -> str:
    return (
        f"  {name:<14} {f.steps:>9} {f.tokens:>10.4g} {f.hours / 24:>7.1f} {f.facility_mwh:>10.1f} {f.failures:>8.1f} "
        f"{f.goodput:>7.1%} {f.wall_hours / 24:>9.1f}"
    )
