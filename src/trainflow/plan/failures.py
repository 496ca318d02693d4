"""A campaign under failures, three ways: a seeded Monte Carlo, the same model's exact expectation (renewal), and the
issue's first-order closed form. trainflow.plan.goodput runs them for each of its scenarios.

    python -c "from trainflow.plan.failures import Timeline, expected; print(expected(Timeline(work_s=3.6e6, \
        interval_s=1800, blocking_s=120, write_s=0, detect_s=300, wait_s=300, held_s=400, mtbf_s=14400, jobs_s=0)))"

The model: failures arrive with exponential gaps of mean M while the job holds its nodes. A run trains interval_s
(and evaluates eval_share of it on top: the stretch), blocks blocking_s, again and again; a checkpoint is durable
write_s after its block. A failure loses the work since
the newest durable checkpoint, then costs detect_s and wait_s (no nodes held: no failure strikes) and held_s of
start-up and load (nodes held: a failure may strike). Every job start and planned boundary costs jobs_s in all.
Where a share of the failures is recovered from peers (Timeline.peers, resilience.recovery=peers: every one but the
hangs), each of those costs its recovery and half a step (PeersPath.cost_s) held, and loses no work since the
checkpoint; the others go the job path above. A peers recovery lasts a minute against an MTBF of hours: no failure
strikes in it (the model's one simplification beyond the job path's). So the job path's failures arrive at the rate
(1 - share)/M, and the peers path's at share/M in the time failures may strike in, each adding cost_s.

- simulate: each trial's campaign, one pass per failure of the job path, vectorised over trials; the peers path's
  failures in a pass are Poisson in the time it held the nodes (their own generator: the job path's draws are the
  same with or without them). Its passes are as many as a trial's failures, so it runs only where those are few
  enough (MAX_FAILURES expected per trial, MAX_PASSES in its slowest).
- expected: the mean and 5-95 % band of the same model without sampling. Failures are memoryless, so each stretch
  from one durable checkpoint to the next (a leg) is independent of the others: it succeeds if its a seconds pass
  without a failure, else the restart needs b = held_s + the redone work in one piece, a geometric number of tries.
  Its mean is (1 - e^-a/M) (M + c + (e^(b/M) - 1)(M + c)) with c = detect_s + wait_s, its variance the compound
  geometric one; the campaign's wall time is the sum of its legs, normal by the central limit theorem over the
  thousands of failures where this is used, and the goodput's band follows from it. The peers path's recoveries
  stretch every exposed piece x of a leg to x + cost_s N, N Poisson of mean x share/M: mean k x and variance
  k^2 var(x) + share/M cost_s^2 E[x], k = 1 + share cost_s/M.
- closed_form: waste ~ C/tau + (tau/2 + D + R)/M (Young, Daly), taken as time:
  wall = (work (1 + C/tau + e) + job starts) / (1 - (tau (1 + e)/2 + D + R)/M), e the evaluation's share (and peer
  snapshots' blocking share, Timeline.snapshot_share, which counts as checkpoint time); 0 where failures cost all the
  time. With the peers path, each of lost work, D and R is the two paths' weighted by their
  shares (the peers path's lost work half a step).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from trainflow.badput import Badput

MAX_FAILURES = 6000
"""The most failures a trial may expect for the Monte Carlo to run (about 45 us a pass at 400 trials): beyond it,
`expected` gives the figures."""
MAX_PASSES = 2 * MAX_FAILURES
"""The most passes a simulation runs (its slowest trial's failures): past it, `expected` gives the figures."""
Z_BAND = 1.6449
"""The standard normal's 95th percentile: the band of `expected` is the mean wall time -+ Z_BAND sigma."""
PEERS_STREAM = 1
"""simulate draws the peers path's recoveries from the generator of (seed, PEERS_STREAM)."""


@dataclass(frozen=True)
class PeersPath:
    """The failures recovered from peers (trainflow.plan.peers) and what each costs, in seconds; none by default."""

    share: float = 0.0
    """Of all failures: resilience.recovery=peers takes every one but the hangs (1 - hardware.hang_share)."""
    detect_s: float = 0.0
    restart_s: float = 0.0
    """From the detection to the ranks ready to redo the failed step: no queue, no checkpoint read."""
    lost_s: float = 0.0
    """The failed step's part done before the failure, redone: half a step on average."""

    @property
    def cost_s(self) -> float:
        return self.detect_s + self.restart_s + self.lost_s


@dataclass(frozen=True)
class Timeline:
    """The times a campaign under failures is made of (module docstring), in seconds."""

    work_s: float
    interval_s: float
    blocking_s: float
    write_s: float
    detect_s: float
    wait_s: float
    held_s: float
    mtbf_s: float
    jobs_s: float
    eval_share: float = 0.0
    """Evaluation's seconds per second of training (held nodes, no kept steps)."""
    peers: PeersPath = PeersPath()
    """The share of failures recovered from peers and its costs; detect_s, wait_s and held_s are the job path's."""
    snapshot_share: float = 0.0
    """Peer snapshots' blocking seconds per second of training (plan.snapshots): held nodes, no kept steps."""

    @property
    def job_share(self) -> float:
        """The share of failures that go the job path."""
        return 1 - self.peers.share

    @property
    def mean_detect_s(self) -> float:
        """D over both paths, weighted by their shares (detect_s where no failure is recovered from peers)."""
        return self.job_share * self.detect_s + self.peers.share * self.peers.detect_s

    @property
    def mean_restart_s(self) -> float:
        """R over both paths, weighted by their shares (restart_s where no failure is recovered from peers)."""
        return self.job_share * self.restart_s + self.peers.share * self.peers.restart_s

    @property
    def restart_s(self) -> float:
        return self.wait_s + self.held_s

    @property
    def run_s(self) -> float:
        """The campaign's training, evaluation and snapshots, failures aside."""
        return self.work_s * (1 + self.eval_share + self.snapshot_share)

    @property
    def stretch_s(self) -> float:
        """One interval's training, its evaluations and its snapshots."""
        return self.interval_s * (1 + self.eval_share + self.snapshot_share)

    @property
    def period_s(self) -> float:
        return self.stretch_s + self.blocking_s


def simulate(t: Timeline, *, trials: int, seed: int, max_passes: int = MAX_PASSES) -> np.ndarray | None:
    """Each trial's goodput, work_s over its wall time: vectorised over trials, one pass per run between failures;
    None where a trial is still running after max_passes (a trial's failures are geometric: a few run long)."""
    rng, pauses = np.random.default_rng(seed), np.random.default_rng((seed, PEERS_STREAM))
    job_mtbf_s = t.mtbf_s / t.job_share if t.job_share else math.inf
    peers_rate = t.peers.share / t.mtbf_s
    done, wall = np.zeros(trials), np.zeros(trials)
    active = np.arange(trials)
    restart = 0.0  # the first run starts from nothing: its start-up is in jobs_s
    for _ in range(max_passes):
        if not active.size:
            return t.work_s / (wall + t.jobs_s)
        x = rng.exponential(job_mtbf_s, active.size)  # time to the job path's next failure
        run = x - restart  # < 0: it struck during the start-up or the load
        remaining = t.run_s - done[active]
        pieces = np.ceil(remaining / t.stretch_s)
        finish = remaining + (pieces - 1) * t.blocking_s
        ends = run >= finish
        durable = np.floor(np.clip(run - t.write_s, 0, None) / t.period_s)  # checkpoints durable before the failure
        done[active] += np.where(ends, remaining, np.minimum(durable, pieces - 1) * t.stretch_s)
        recovered = pauses.poisson(peers_rate * np.where(ends, restart + finish, x))  # in the time nodes were held
        wall[active] += np.where(ends, restart + finish, x + t.detect_s + t.wait_s) + recovered * t.peers.cost_s
        active, restart = active[~ends], t.held_s
    return None if active.size else t.work_s / (wall + t.jobs_s)


def legs(t: Timeline) -> list[tuple[float, float, float]]:
    """(count, a, b) of the campaign's legs from one durable checkpoint to the next (or to the end): a, the seconds
    the run must pass without a failure; b, what a restart must (held_s and the leg's work from its checkpoint)."""
    pieces = max(1, math.ceil(t.run_s / t.stretch_s))
    last = t.run_s - (pieces - 1) * t.stretch_s
    finish = (pieces - 1) * t.period_s + last
    # Checkpoints 1 .. k are durable before the end: k period + write < finish.
    k = min(pieces - 1, max(0, math.ceil((finish - t.write_s) / t.period_s) - 1))
    if k == 0:
        return [(1, finish, t.held_s + finish)]
    first = t.period_s + t.write_s
    out = [(1, first, t.held_s + first), (k - 1, t.period_s, t.held_s + first)]
    return [*out, (1, finish - k * t.period_s - t.write_s, t.held_s + finish - k * t.period_s)]


def _truncated(a: float, rate: float) -> tuple[float, float]:
    """Mean and variance of an exponential gap of `rate` given that it is shorter than a."""
    x = rate * a
    if x < 1e-3:  # the series: the exact forms cancel catastrophically
        return a * (0.5 - x / 12), a * a * (1 / 12 - x * x / 720)
    em1 = math.expm1(x)
    return 1 / rate - a / em1, 1 / rate**2 - a * a * (em1 + 1) / em1**2


def _paused(mean: float, var: float, rate: float, pause_s: float) -> tuple[float, float]:
    """Mean and variance of the wall time of an exposed piece of `mean` and `var` seconds with the peers path's
    recoveries in it: Poisson at `rate`, pause_s each (module docstring)."""
    k = 1 + rate * pause_s
    return k * mean, k * k * var + rate * pause_s * pause_s * mean


def _leg(a: float, b: float, rate: float, c: float, peers: tuple[float, float]) -> tuple[float, float, float]:
    """A leg's mean and variance of wall time and its expected failures (module docstring), the job path's at `rate`,
    the peers path's (rate, cost) `peers`; inf where e^(b/M) overflows."""
    if rate * b > 700:
        return math.inf, math.inf, math.inf
    tries = math.expm1(rate * b)  # failed restarts expected before one gets through: e^(b/M) - 1
    t_b = _truncated(b, rate)
    m_b, v_b = _paused(*t_b, *peers)
    ok_b, var_b = _paused(b, 0.0, *peers)
    restart_mean = tries * (m_b + c) + ok_b
    restart_var = tries * v_b + tries * (tries + 1) * (m_b + c) ** 2 + var_b
    fails = -math.expm1(-rate * a)  # 1 - e^(-a/M): the leg's first try fails
    t_a = _truncated(a, rate)
    m_a, v_a = _paused(*t_a, *peers)
    ok_a, var_a = _paused(a, 0.0, *peers)
    after = m_a + c + restart_mean
    mean = (1 - fails) * ok_a + fails * after
    var = (1 - fails) * var_a + fails * (v_a + restart_var) + fails * (1 - fails) * (after - ok_a) ** 2
    exposed = (1 - fails) * a + fails * (t_a[0] + tries * t_b[0] + b)  # the time failures may strike in
    return mean, var, fails * (tries + 1) + peers[0] * exposed


def _campaign(t: Timeline) -> tuple[float, float, float]:
    """The wall time's mean and variance and the failures expected in one campaign."""
    rate, c, peers = t.job_share / t.mtbf_s, t.detect_s + t.wait_s, (t.peers.share / t.mtbf_s, t.peers.cost_s)
    mean, var, failures = t.jobs_s, 0.0, 0.0
    for count, a, b in legs(t):
        if count:
            m, v, f = _leg(a, b, rate, c, peers)
            mean, var, failures = mean + count * m, var + count * v, failures + count * f
    return mean, var, failures


def failures(t: Timeline) -> float:
    """Failures one campaign expects."""
    return _campaign(t)[2]


def expected(t: Timeline) -> tuple[float, float, float]:
    """The goodput's mean and 5-95 % band, without sampling (module docstring); 0 where the wall time overflows."""
    mean, var, _ = _campaign(t)
    if not math.isfinite(mean) or not math.isfinite(var):
        return 0.0, 0.0, 0.0
    sigma, fastest = math.sqrt(var), sum(count * a for count, a, _ in legs(t)) + t.jobs_s
    spread = sigma / mean
    goodput = t.work_s / mean * (1 + spread * spread)  # E[work / wall] to second order
    return goodput, t.work_s / (mean + Z_BAND * sigma), t.work_s / max(mean - Z_BAND * sigma, fastest)


def closed_form(t: Timeline) -> tuple[float, dict[str, float]]:
    """The goodput the issue's first-order waste gives, and the waste by category (trainflow.badput)."""
    terms = {
        Badput.CHECKPOINT: t.blocking_s / t.interval_s + t.snapshot_share,
        Badput.LOST_WORK: (t.job_share * t.stretch_s / 2 + t.peers.share * t.peers.lost_s) / t.mtbf_s,
        Badput.DETECTION: t.mean_detect_s / t.mtbf_s,
        Badput.RESTART: t.mean_restart_s / t.mtbf_s,
        Badput.START_UP: t.jobs_s / t.work_s,
        Badput.EVALUATION: t.eval_share,
    }
    lost = terms[Badput.LOST_WORK] + terms[Badput.DETECTION] + terms[Badput.RESTART]
    paid = terms[Badput.CHECKPOINT] + terms[Badput.START_UP] + terms[Badput.EVALUATION]
    return max(0.0, 1 - lost) / (1 + paid), terms
