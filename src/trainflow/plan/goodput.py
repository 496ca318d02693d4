"""Goodput, planned: the share of a campaign's wall time that becomes kept training steps, under failures at
cluster.hardware.mtbf_hours, with synchronous checkpoints as configured and with each of issue 24's remedies.

    python -m trainflow.plan experiment=llama70b_alps      # the goodput section

The campaign is train.total_steps steps of the plan's step time. Failures arrive with exponential gaps of mean M (the
MTBF) while the job holds its nodes: training, checkpoint blocking, start-up and load. A failure loses the work since
the newest durable checkpoint (the steps since it and the partial step), then costs detection D and restart R
(allocation wait, start-up, checkpoint load). Training blocks C for a checkpoint every tau of training. Besides
failures, every job start costs its allocation wait and start-up, and every planned job boundary (a segment's end, a
job's time limit) a blocking save and a load: the job-start term, the same in every scenario.

The scenarios (trainflow.plan.scenarios), each with its own C, tau, D and R, and whether trainflow builds what it
assumes: the baseline without trainflow's remedies, the campaign as configured, and each remedy on top of it, the
built ones (async checkpoints, where the experiment checkpoints synchronously) and those not built yet, marked so
(hot restart, the single read). Every scenario pays the same evaluation (train.eval_batches forward passes of a
global batch every train.eval_every steps, a forward a third of a step) and the same job starts.
Three models (trainflow.plan.failures): a Monte Carlo of TRIALS campaigns (numpy, seeded, so the plan is
deterministic), its mean and 5-95 % band over trials, where a trial expects at most failures.MAX_FAILURES failures;
beyond that the same model's exact expectation and band (a note names the scenarios); and the closed form of the
issue, waste ~ C/tau + (tau/2 + D + R)/M (Young, Daly). The simulation also loses an async checkpoint's write window
and lets failures strike only while nodes are held; the closed form counts them over all wall time. They agree within
3 % absolute while failures cost up to ~30 % (tests/unit/test_goodput_plan.py) and drift apart beyond: 6 points for the
seed's baseline at MTBF 1 h. A campaign whose configured scenario keeps less than FINISH_FLOOR of its wall time, or
whose detection and restart outlast the MTBF, cannot finish: `cannot_finish` says so in one line.

Recovery from peers (plan.peers, plan.scenarios): `peers` holds its terms and its goodput, as configured or as a
what-if of a config that recovers as a job, or why the rules refuse it.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from enum import StrEnum

import numpy as np

from trainflow.badput import Badput
from trainflow.checkpoint.interval import file_system_mtbf_s
from trainflow.config.schema import TrainflowConfig
from trainflow.plan.campaign import CampaignPlan
from trainflow.plan.failures import MAX_FAILURES, MAX_PASSES, closed_form, expected, failures, simulate
from trainflow.plan.peers import PeersRecovery
from trainflow.plan.scenarios import CONFIGURED, CheckTimes, LoadTimes, ScenarioRun, ScenarioTimes, plan_scenarios
from trainflow.plan.setup import PlanSetup
from trainflow.plan.snapshots import SnapshotPlan
from trainflow.plan.startup import StartupPlan
from trainflow.records import Record

GOAL = 0.95
"""Issue 24's goal for the seed's campaign."""
FINISH_FLOOR = 0.01
"""Below this goodput a campaign takes over 100 times its steps' time: it cannot finish."""
TRIALS = 400
SEED = 24
BAND = (5.0, 95.0)
"""The percentiles over trials the simulated goodput's band spans."""


class Method(StrEnum):
    """How a scenario's goodput and band were found (trainflow.plan.failures)."""

    SIMULATED = "simulated"
    """The Monte Carlo of TRIALS campaigns."""
    EXPECTED = "expected"
    """The same model's exact expectation: more failures than a trial may simulate."""


@dataclass(frozen=True)
class GoodputScenario(Record):
    name: str
    built: bool
    """Whether trainflow builds every remedy the scenario assumes (False: what it would give)."""
    blocking_s: float
    """C: how long training stops for one checkpoint."""
    write_s: float
    """The background write an async checkpoint is durable after (0: synchronous)."""
    interval_steps: int
    interval_s: float
    """tau: training between two checkpoints."""
    detect_s: float
    """D: from the failure to the job's end (with recovery from peers, both paths' weighted by their shares)."""
    restart_s: float
    """R: allocation wait + start-up + checkpoint load (with recovery from peers, both paths' weighted)."""
    simulated: float
    simulated_low: float
    simulated_high: float
    """The band over trials (BAND)."""
    closed_form: float
    terms: dict[str, float]
    """The closed form's waste by term: checkpoint C/tau, lost work tau/2M, detection D/M, restart R/M and the job
    starts' time over the productive time."""
    meets_goal: bool
    """The simulated mean reaches GOAL."""
    failures: float
    """Failures one campaign expects."""
    method: Method
    """Whether `simulated` and its band are the Monte Carlo's or, past MAX_FAILURES a trial, the expectation's."""


@dataclass(frozen=True)
class PeersGoodput(Record):
    """Recovery from peers for this campaign: its terms, the job path's failure to first step beside it, and the
    goodput with it, as configured (resilience.recovery=peers) or as a what-if; or why the rules refuse it."""

    configured: bool
    recovery: PeersRecovery | None = None
    """None where the rules refuse recovery from peers for this config (`refused`)."""
    job_first_step_s: float = 0.0
    """The job path's failure to first step, its D + R: a hang's where peers recover the rest."""
    scenario: GoodputScenario | None = None
    """The goodput with it: the configured scenario, or the what-if (plan.scenarios.WHAT_IF)."""
    refused: str | None = None
    snapshots: SnapshotPlan | None = None
    """Peer snapshots' terms (checkpoint.snapshot_steps > 0); None without them."""
    interval_how: str = ""
    """Where the file-system checkpoint's interval comes from under recovery from peers (interval_how())."""


@dataclass(frozen=True)
class GoodputPlan(Record):
    goal: float
    mtbf_s: float
    productive_s: float
    """train.total_steps x the plan's step."""
    jobs: int
    """Jobs of the campaign without failures: each segment split at the allocation's time limit."""
    load_s: float
    trials: int
    seed: int
    scenarios: list[GoodputScenario] = field(default_factory=list)
    needed: str | None = None
    """What all remedies together would need to reach the goal; None when they reach it."""
    notes: list[str] = field(default_factory=list)
    cannot_finish: str | None = None
    """The one line saying the configured campaign cannot finish at this MTBF, and why; None when it can."""
    peers: PeersGoodput | None = None
    """Recovery from peers (PeersGoodput); None in a plan written before it was planned."""

    @property
    def configured(self) -> GoodputScenario:
        """The scenario of the campaign as configured."""
        return next(s for s in self.scenarios if s.name == CONFIGURED)


def plan_goodput(
    cfg: TrainflowConfig, setup: PlanSetup, *, step_s: float, campaign: CampaignPlan, startup: StartupPlan
) -> GoodputPlan:
    """Every scenario's goodput for cfg's campaign (`startup`: its start-up, plan.startup)."""
    times = plan_scenarios(cfg, setup, step_s=step_s, campaign=campaign, startup=startup)
    scenarios = [scenario(run) for run in times.runs]
    h, rt, jobs, loads = cfg.cluster.hardware, cfg.cluster.runtime, times.jobs, times.loads
    mtbf_s = h.mtbf_hours * 3600
    configured = next(s for s in scenarios if s.name == CONFIGURED)
    notes = [
        f"detection with trainflow's: a dead rank {times.dead_s:.0f} s, a hung one {times.hung_s:.0f} s, hang_share "
        f"{h.hang_share:.0%}; without: the collective timeout, {rt.collective_timeout_s} s",
        f"{jobs} jobs (train.segments {cfg.train.segments}, {cfg.cluster.allocation.time_min} min at most each) cost "
        f"{configured.terms[Badput.START_UP]:.1%} of the steps' time as configured in allocation waits, start-ups, "
        f"saves and loads; evaluation {times.eval_share:.1%} in every scenario (train.eval_batches "
        f"{cfg.train.eval_batches} every train.eval_every {cfg.train.eval_every} steps)",
        checks_note(cfg, times.check),
        *caveats(scenarios, refused=campaign.asynchronous.refused, loads=loads),
    ]
    return GoodputPlan(
        goal=GOAL,
        mtbf_s=mtbf_s,
        productive_s=cfg.train.total_steps * step_s,
        jobs=jobs,
        load_s=loads.single_s,
        trials=TRIALS,
        seed=SEED,
        scenarios=scenarios,
        needed=needed(scenarios[-1], mtbf_s),
        notes=notes,
        cannot_finish=cannot_finish(configured, scenarios[-1], mtbf_s),
        peers=replace(peers_goodput(times, configured), interval_how=interval_how(cfg)),
    )


def peers_goodput(times: ScenarioTimes, configured: GoodputScenario) -> PeersGoodput:
    """Recovery from peers' terms and goodput: the configured scenario's where it recovers from peers, else the
    what-if's; the rules' refusal where they refuse it."""
    if times.peers is None:
        return PeersGoodput(configured=False, refused=times.peers_refused)
    run = times.what_if or next(r for r in times.runs if r.remedies.name == CONFIGURED)
    t = run.timeline
    return PeersGoodput(
        configured=times.what_if is None,
        recovery=times.peers,
        job_first_step_s=t.detect_s + t.restart_s,
        scenario=configured if times.what_if is None else scenario(times.what_if),
        snapshots=times.snapshots,
    )


def interval_how(cfg: TrainflowConfig) -> str:
    """Where the file-system checkpoint's interval comes from under resilience.recovery=peers (checkpoint.interval's
    file_system_mtbf_s): the job path's MTBF, as the trainer plans it."""
    h, c = cfg.cluster.hardware, cfg.checkpoint
    if c.interval_steps:
        return "checkpoint.interval_steps, as configured"
    if not h.hang_share:
        return "checkpoint.max_interval_steps: hang_share 0, no failure needs the file system"
    return (
        f"Young/Daly at the job path's MTBF, mtbf_hours / hang_share = {h.mtbf_hours:g} / {h.hang_share:g} = "
        f"{file_system_mtbf_s(cfg) / 3600:.3g} h"
    )


def checks_note(cfg: TrainflowConfig, check: CheckTimes) -> str:
    """What the restarts after a failure no evidence pins add: the gate's checks of the job's hosts."""
    h, hot = cfg.cluster.hardware, cfg.cluster.allocation.spare_nodes > 0
    where = "a job step on the allocation" if hot else "a job of their own (no spare nodes)"
    start = "hot_restart_s" if hot else "requeue_wait_s + startup_s"
    return (
        f"a failure no evidence pins (symmetric_share {h.symmetric_share:.0%}: a hang every rank waits in, an NCCL "
        f"error no node confirms) first has the job's hosts checked, {where}: {check.seconds(hot=hot):.0f} s "
        f"({start} {check.seconds(hot=hot) - check.sweep_s:.0f} s and the gate's sweep {check.sweep_s:.1f} s), "
        f"{h.symmetric_share * check.seconds(hot=hot):.0f} s a restart on average as configured"
    )


def caveats(scenarios: list[GoodputScenario], *, refused: str | None, loads: LoadTimes) -> list[str]:
    """The notes that hold only for some plans: scenarios not sampled, async refused, the replicas' loads."""
    notes = []
    if expected_only := [s for s in scenarios if s.method is Method.EXPECTED]:
        notes.append(
            f"{names(expected_only, scenarios)}: the same model's exact expectation and normal band, not sampled: a "
            f"campaign expects {min(s.failures for s in expected_only):.3g} failures or more, past the {MAX_FAILURES} "
            f"a simulated trial may expect (or its slowest the {MAX_PASSES} passes) (trainflow.plan.failures)"
        )
    if refused:
        notes.append(f"the async scenarios checkpoint synchronously: {refused}")
    if loads.replicas > 1:
        notes.append(
            f"a load reads the checkpoint once ({loads.read_s:.4g} s) and gathers each rank's replicated state over "
            f"its {loads.replicas} dp replicas' links ({loads.exchange_s:.3g} s; checkpoint.single_read); the "
            f"baseline's replicas each read their own copy: {loads.per_replica_s:.4g} s unless the file servers' "
            "caches serve the repeats (not measured)"
        )
    return notes


def scenario(run: ScenarioRun) -> GoodputScenario:
    """One scenario, simulated (or past MAX_FAILURES a trial, its expectation) and in closed form."""
    t = run.timeline
    expects = failures(t)
    sim = simulate(t, trials=TRIALS, seed=SEED) if expects <= MAX_FAILURES else None
    if sim is not None:
        mean, (low, high), method = float(sim.mean()), np.percentile(sim, BAND), Method.SIMULATED
    else:
        (mean, low, high), method = expected(t), Method.EXPECTED
    closed, terms = closed_form(t)
    return GoodputScenario(
        name=run.remedies.name,
        built=run.built,
        blocking_s=t.blocking_s,
        write_s=t.write_s,
        interval_steps=run.interval_steps,
        interval_s=t.interval_s,
        detect_s=t.mean_detect_s,
        restart_s=t.mean_restart_s,
        simulated=mean,
        simulated_low=float(low),
        simulated_high=float(high),
        closed_form=closed,
        terms=terms,
        meets_goal=bool(mean >= GOAL),
        failures=expects,
        method=method,
    )


def needed(best: GoodputScenario, mtbf_s: float) -> str | None:
    """What the scenario with every remedy would need to reach GOAL, from the closed form; None if it does."""
    if best.meets_goal:
        return None
    t = best.terms
    allowed = 1 - GOAL * (1 + t[Badput.CHECKPOINT] + t[Badput.START_UP] + t[Badput.EVALUATION])  # failures' share
    lost_s = t[Badput.LOST_WORK] * mtbf_s  # tau/2 of training and its evaluations
    per_failure = lost_s + best.detect_s + best.restart_s
    if allowed <= 0:
        return (
            f"{GOAL:.0%} is out of reach before any failure: the job starts and evaluation alone cost "
            f"{t[Badput.START_UP] + t[Badput.EVALUATION]:.1%}"
        )
    return (
        f"all remedies reach {best.simulated:.1%}; {GOAL:.0%} needs at most {allowed * mtbf_s:.0f} s lost per failure "
        f"(now tau/2 {lost_s:.0f} + D {best.detect_s:.0f} + R {best.restart_s:.0f} = {per_failure:.0f} s"
        f") or an MTBF of {per_failure / allowed / 3600:.3g} h"
    )


def cannot_finish(configured: GoodputScenario, best: GoodputScenario, mtbf_s: float) -> str | None:
    """The one line saying the configured scenario's campaign cannot finish at this MTBF (FINISH_FLOOR, or detection
    and restart outlasting the MTBF), its cause and the way out; None when it can. A campaign that expects less than
    one failure finishes, however little of its time its steps take (a smoke run's job starts dwarf its seconds of
    steps: that is the job starts' term, not the failures')."""
    s, recovery = configured, configured.detect_s + configured.restart_s
    if s.failures < 1 or (recovery < mtbf_s and s.simulated >= FINISH_FLOOR):
        return None
    interval_s = s.interval_s + s.blocking_s
    if recovery >= mtbf_s and not (s.simulated < FINISH_FLOOR and interval_s > recovery):
        cause = (
            f"detecting a failure and restarting (D {seconds(s.detect_s)} s + R {seconds(s.restart_s)} s) take longer "
            "than the MTBF, so the next failure is due before the job is back"
        )
        fix = "shorten the restart (cluster.hardware.requeue_wait_s, startup_s) and detection (cluster.runtime)"
    else:
        cause = (
            f"a run must train tau + C = {seconds(interval_s)} s without a failure to save its next checkpoint, "
            f"{interval_s / mtbf_s:.3g} times the MTBF"
        )
        fix = "shorten the interval (checkpoint.interval_steps) or the step"
    remedies = f"; all remedies keep {best.simulated:.1%}" if best is not configured else ""
    return (
        f"the campaign cannot finish at MTBF {mtbf_s / 3600:.3g} h (cluster.hardware.mtbf_hours), {s.name}: {cause}: "
        f"{s.failures:.3g} failures expected, goodput {s.simulated:.2%}{remedies}; {fix}, or raise the MTBF"
    )


def names(some: list[GoodputScenario], every: list[GoodputScenario]) -> str:
    return "every scenario" if len(some) == len(every) else ", ".join(s.name for s in some)


def seconds(value: float) -> str:
    """Seconds as a person reads them in a line: whole below a billion (11366, not 1.137e+04), bounded above it."""
    return f"{value:.0f}" if value < 1e9 else f"{value:.3g}"
