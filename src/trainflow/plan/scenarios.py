"""The goodput plan's scenarios: which remedies each assumes, whether trainflow builds them, and the times of a
campaign under failures (trainflow.plan.failures.Timeline) that follow.

    python -m trainflow.plan experiment=llama70b_alps      # the goodput section

- baseline: synchronous checkpoints, and D the collective timeout, which the survivors of a dead or hung rank wait
  out without trainflow's heartbeat and srun's kill-on-bad-exit (over NCCL on RDMA a dead peer is as silent as a
  hung one); R a new job: requeue_wait_s + startup_s + the load, which each dp replica reads for itself (DCP's own
  loader: replicas x the single read's time, unless the file servers' caches serve the repeats, not measured).
- as configured: the experiment's checkpoint.mode, trainflow's detection (built, always on: a dead rank ends the job
  within resilience.failure_detect_s, a hung one within the heartbeat's threshold, hang_threshold_s, each
  at most the collective timeout, mixed by hardware.hang_share) and the single read (built, always on:
  checkpoint.single_read): a load is the checkpoint read once at hardware.checkpoint_read_gbps, then each rank's
  replicated state exchanged over its replica group's links (an all-gather, plan.collectives). R: with
  cluster.allocation.spare_nodes > 0 a hot restart (launch.supervisor: hot_restart_s + the load, no new job; the
  spares' idle node-hours are not in a goodput of time), else a new job (launch.restart).
- + async checkpoints (built; listed where the experiment checkpoints synchronously): C, tau and the write as
  plan.campaign's async mode gives them; a checkpoint is durable once its background write ends, and a fixed
  interval shorter than the write adds its wait for the last one to C. Where campaign refuses async (host memory),
  the scenario checkpoints synchronously, and a note says why.
- + hot restart (built; listed where the experiment holds no spare nodes): R = hot_restart_s + the load.
- all remedies: every one of them (recovery from peers as configured).

Recovery from peers (resilience.recovery=peers, plan.peers): the failures but the hangs (1 - hardware.hang_share) cost
the recovery's terms and half a step each (with peer snapshots and no replica, half the snapshot interval and the
chance of one more; the snapshots' blocking is paid on every step: plan.snapshots), no lost interval, no load, no queue
(plan.failures.PeersPath); the hangs take the job path, whose detection is then the heartbeat's alone, and the failures
no evidence pins are among them (as the preset's network failures are: symmetric_share / hang_share of the job path's
restarts check the hosts, at most all). Every scenario but the baseline recovers as configured; where a config
recovering as a job allows peers (config.rules: a spare node, dp replicas), the configured campaign with it is a what-if
(WHAT_IF, not in the table).

Every scenario with trainflow's detection adds to its restarts the gate's checks of the job's hosts that trainflow
runs after a failure no evidence pins (hardware.symmetric_share of them; check_times): their start (a job step with
spares, a new job without) and their sweep.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

from trainflow.config.resilience import hang_threshold_s
from trainflow.config.schema import TrainflowConfig
from trainflow.errors import ConfigError
from trainflow.plan.campaign import CampaignPlan
from trainflow.plan.collectives import allreduce_seconds, group_link
from trainflow.plan.failures import PeersPath, Timeline
from trainflow.plan.peers import PeersRecovery, plan_peers
from trainflow.plan.remedies import apply
from trainflow.plan.setup import PlanSetup
from trainflow.plan.snapshots import SnapshotPlan, campaign_snapshots
from trainflow.plan.startup import StartupPlan

HOT_RESTART_BUILT = True
"""An in-job restart onto spare nodes (launch.supervisor, cluster.allocation.spare_nodes)."""
SINGLE_READ_BUILT = True
"""Replicated state read once per job start and exchanged over the dp group (checkpoint.single_read)."""
PEERS_BUILT = True
"""Recovery from peers (resilience.recovery=peers: launch.peer_recovery, launch.peers, train.peer_state)."""


@dataclass(frozen=True)
class Remedies:
    """What a scenario assumes: async checkpoints (None: checkpoint.mode as configured), trainflow's fast detection, a
    hot restart (None: where cluster.allocation.spare_nodes holds spares), the single read."""

    name: str
    asynchronous: bool | None
    fast_detection: bool
    hot_restart: bool | None
    single_read: bool
    peers: bool | None = None
    """Recovery from peers (None: resilience.recovery as configured)."""
    only_if_sync: bool = False
    """Listed only where the experiment checkpoints synchronously (else it is what "as configured" does)."""
    only_if_no_spares: bool = False
    """Listed only where the experiment holds no spare nodes (else it is what "as configured" does)."""

    @property
    def built(self) -> bool:
        return (HOT_RESTART_BUILT or not self.hot_restart) and (SINGLE_READ_BUILT or not self.single_read)

    def listed(self, cfg: TrainflowConfig) -> bool:
        return not (self.only_if_sync and cfg.checkpoint.mode == "async") and not (
            self.only_if_no_spares and cfg.cluster.allocation.spare_nodes > 0
        )

    def uses_async(self, cfg: TrainflowConfig, campaign: CampaignPlan) -> bool:
        wanted = cfg.checkpoint.mode == "async" if self.asynchronous is None else self.asynchronous
        return wanted and not campaign.asynchronous.refused

    def uses_hot_restart(self, cfg: TrainflowConfig) -> bool:
        return cfg.cluster.allocation.spare_nodes > 0 if self.hot_restart is None else self.hot_restart

    def uses_peers(self, cfg: TrainflowConfig) -> bool:
        return cfg.resilience.recovery == "peers" if self.peers is None else self.peers

    def interval_steps(self, cfg: TrainflowConfig, campaign: CampaignPlan) -> int:
        """The file-system checkpoint's interval: at the job path's MTBF where the config recovers from peers
        (plan.campaign), at every failure's where this scenario does not (the baseline; sync only)."""
        if self.uses_async(cfg, campaign):
            return campaign.asynchronous.interval_steps
        if cfg.resilience.recovery == "peers" and not self.uses_peers(cfg):
            return campaign.job_interval_steps or campaign.interval_steps
        return campaign.interval_steps


CONFIGURED = "as configured"
"""The scenario of the campaign as its config runs it."""
SCENARIOS = (
    Remedies("baseline (sync, timeout)", False, False, False, False, peers=False),
    Remedies(CONFIGURED, None, True, None, True),
    Remedies("+ async checkpoints", True, True, None, True, only_if_sync=True),
    Remedies("+ hot restart", None, True, True, True, only_if_no_spares=True),
    Remedies("all remedies", True, True, True, True),
)
WHAT_IF = Remedies(f"{CONFIGURED} + recovery from peers", None, True, None, True, peers=True)
"""The configured campaign recovering from peers, where it recovers as a job and the rules allow peers."""


@dataclass(frozen=True)
class LoadTimes:
    """A job start's checkpoint load, both ways (module docstring)."""

    read_s: float
    """The checkpoint read once at hardware.checkpoint_read_gbps."""
    exchange_s: float
    """Each rank's replicated state gathered over its replica group (plan.collectives.shard_seconds)."""
    replicas: int
    """The dp replicas that each read their own copy without the single read."""

    @property
    def single_s(self) -> float:
        return self.read_s + self.exchange_s

    @property
    def per_replica_s(self) -> float:
        return self.replicas * self.read_s


def eval_share(cfg: TrainflowConfig) -> float:
    """Evaluation's seconds per second of training: train.eval_batches forward passes of a global batch every
    train.eval_every steps, a forward a third of a step (forward and backward: three forwards' work)."""
    return cfg.train.eval_batches / (3 * cfg.train.eval_every)


def load_times(cfg: TrainflowConfig, campaign: CampaignPlan, setup: PlanSetup) -> LoadTimes:
    """The load read once plus the exchange (checkpoint.single_read reads first, then exchanges), and the replicas."""
    replica = setup.groups.replica
    per_rank = campaign.checkpoint_bytes * replica.size / setup.layout.world_size  # what each rank of a replica holds
    read_s = campaign.checkpoint_bytes / (cfg.cluster.hardware.checkpoint_read_gbps * 1e9)
    return LoadTimes(read_s=read_s, exchange_s=replica.shard_s(per_rank), replicas=replica.size)


@dataclass(frozen=True)
class ScenarioRun:
    """One listed scenario: what it assumes, its campaign's times and its checkpoint interval."""

    remedies: Remedies
    timeline: Timeline
    interval_steps: int
    built: bool
    """Whether trainflow builds every remedy it assumes (Remedies.built; PEERS_BUILT where it recovers from peers)."""


@dataclass(frozen=True)
class ScenarioTimes:
    """What the goodput plan takes from the config, resolved once: the jobs, the loads, the detection, evaluation's
    share and every listed scenario's times. plan.goodput simulates the scenarios and writes its notes from it."""

    jobs: int
    """Jobs of the campaign without failures (job_count)."""
    eval_share: float
    loads: LoadTimes
    dead_s: float
    hung_s: float
    """How long the job runs on after a rank dies or hangs, with trainflow's detection (detection_s)."""
    check: CheckTimes
    runs: list[ScenarioRun]
    peers: PeersRecovery | None
    """A recovery from peers' terms; None where the rules refuse it for this config (peers_refused)."""
    snapshots: SnapshotPlan | None
    """Peer snapshots' terms (checkpoint.snapshot_steps > 0, where peers recover); else None."""
    what_if: ScenarioRun | None
    """WHAT_IF where the config recovers as a job and the rules allow peers; else None."""
    peers_refused: str | None


def plan_scenarios(
    cfg: TrainflowConfig, setup: PlanSetup, *, step_s: float, campaign: CampaignPlan, startup: StartupPlan
) -> ScenarioTimes:
    """cfg's campaign under every listed scenario, each time it needs found once (`startup`: startup_s and
    hot_restart_s as the plan takes them, plan.startup)."""
    jobs, share = job_count(cfg, campaign, step_s), eval_share(cfg)
    loads = load_times(cfg, campaign, setup)
    dead, hung = detection_s(cfg, step_s)
    h, rt, check = cfg.cluster.hardware, cfg.cluster.runtime, check_times(cfg, setup, startup)
    refused = peers_refusal(cfg)
    recovery = None
    if refused is None:
        state = campaign.asynchronous.staging_bytes  # the fullest rank's weights and moments (plan.memory)
        recovery = plan_peers(
            h,
            cfg.cluster.measured,
            detect_s=dead,
            timeout_s=rt.collective_timeout_s,
            state_bytes=state,
            step_s=step_s,
            startup=startup,
        )
    snapshots = campaign_snapshots(cfg, setup, campaign=campaign, step_s=step_s) if recovery else None
    if recovery and snapshots:
        recovery = replace(recovery, lost_steps=snapshots.lost_steps)
    fast = (1 - h.hang_share) * dead + h.hang_share * hung
    a = campaign.asynchronous

    def run(r: Remedies) -> ScenarioRun:
        steps, hot, peers = r.interval_steps(cfg, campaign), r.uses_hot_restart(cfg), r.uses_peers(cfg)
        if r.uses_async(cfg, campaign):  # a save due before the last one's write ends waits for it
            blocking_s, write_s = a.blocking_s + max(0.0, a.background_s - a.interval_s), a.background_s
        else:
            blocking_s, write_s = campaign.save_s, 0.0
        load = loads.single_s if r.single_read else loads.per_replica_s
        wait_s, held_s = (0.0, startup.hot_restart_s + load) if hot else (h.requeue_wait_s, startup.startup_s + load)
        path = recovery.path() if peers and recovery else PeersPath()
        if r.fast_detection:  # trainflow's restarts: after a failure no evidence pins, the hosts are checked first
            job_share = 1 - path.share  # the job path's share of failures, which holds every unpinned one
            held_s += (min(1.0, h.symmetric_share / job_share) if job_share else 0.0) * check.seconds(hot=hot)
        timeline = Timeline(
            work_s=cfg.train.total_steps * step_s,
            interval_s=steps * step_s,
            blocking_s=blocking_s,
            write_s=write_s,
            detect_s=(hung if peers else fast) if r.fast_detection else rt.collective_timeout_s,
            wait_s=wait_s,
            held_s=held_s,
            mtbf_s=h.mtbf_hours * 3600,
            jobs_s=jobs * (h.requeue_wait_s + startup.startup_s) + (jobs - 1) * (campaign.save_s + load),
            eval_share=share,
            peers=path,
            snapshot_share=snapshots.share if peers and snapshots else 0.0,
        )
        return ScenarioRun(r, timeline, steps, built=r.built and (PEERS_BUILT or not peers))

    return ScenarioTimes(
        jobs=jobs,
        eval_share=share,
        loads=loads,
        dead_s=dead,
        hung_s=hung,
        check=check,
        runs=[run(r) for r in SCENARIOS if r.listed(cfg)],
        peers=recovery,
        snapshots=snapshots,
        what_if=run(WHAT_IF) if recovery and cfg.resilience.recovery == "job" else None,
        peers_refused=refused,
    )


def peers_refusal(cfg: TrainflowConfig) -> str | None:
    """Why the rules refuse recovery from peers for cfg (config.rules: no spare node, no dp replica); None where
    they allow it or it is configured."""
    try:
        apply(cfg, {"resilience.recovery": "peers"})
    except ConfigError as err:
        return str(err)
    return None


@dataclass(frozen=True)
class CheckTimes:
    """The gate's checks on a job's hosts before a restart after a failure no evidence pins (hardware.symmetric_share:
    a hang every rank waits in, an NCCL error no node confirms): their start and their sweep."""

    hot_start_s: float
    """With spares, a job step on the allocation (launch.supervisor): hot_restart_s (plan.startup)."""
    new_start_s: float
    """Without, a job of its own (launch.segment_jobs): hardware.requeue_wait_s + startup_s (plan.startup)."""
    sweep_s: float
    """cluster.gate.sweep_iters of each cluster.gate.sweep_mb size over the world and over each of the layout's
    groups, each timed as an all-reduce on its link (plan.collectives)."""

    def seconds(self, *, hot: bool) -> float:
        return (self.hot_start_s if hot else self.new_start_s) + self.sweep_s


def check_times(cfg: TrainflowConfig, setup: PlanSetup, startup: StartupPlan) -> CheckTimes:
    """The checks' times on cfg's cluster and layout."""
    h, g, groups = cfg.cluster.hardware, cfg.cluster.gate, setup.groups
    world = cfg.parallel.world_size
    link = group_link(h, size=world, stride=1, ranks_per_node=setup.ranks_per_node)
    layout = [x for x in (groups.tp, groups.dp, groups.pp, groups.cp) if x.size > 1]
    per_size = (
        allreduce_seconds(mb * 1e6, world, link, h.allreduce_algorithm) + sum(x.allreduce_s(mb * 1e6) for x in layout)
        for mb in g.sweep_mb
    )
    return CheckTimes(startup.hot_restart_s, h.requeue_wait_s + startup.startup_s, g.sweep_iters * sum(per_size))


def job_count(cfg: TrainflowConfig, campaign: CampaignPlan, step_s: float) -> int:
    """Jobs of a campaign without failures: train.segments, each as many as its steps need of the time limit, each
    step paying its share of the configured mode's save blocking."""
    a, t, aw = cfg.cluster.allocation, cfg.train, campaign.asynchronous
    job_s = a.time_min * 60 - a.signal_delay_s  # the pre-timeout signal ends a job's training
    if cfg.checkpoint.mode == "async" and not aw.refused:  # a save blocks for its copy (and a wait for the last one)
        save_s, interval = aw.blocking_s + max(0.0, aw.background_s - aw.interval_s), aw.interval_steps
    else:
        save_s, interval = campaign.save_s, campaign.interval_steps
    per_job = max(1, math.floor(job_s / (step_s + save_s / interval)))
    return t.segments * math.ceil(t.segment_steps / per_job)


def detection_s(cfg: TrainflowConfig, step_s: float) -> tuple[float, float]:
    """(dead, hung): how long the job runs on after a rank dies or hangs, with trainflow's detection."""
    timeout = cfg.cluster.runtime.collective_timeout_s
    r = cfg.resilience
    return min(r.failure_detect_s, timeout), min(hang_threshold_s(r, step_s), timeout)
