"""Recovery from peers (resilience.recovery=peers), the supervisor's side: it serves the store the ranks' generations
meet in (launch.peers), and when one breaks it finds the ranks that left, plans the next generation and starts their
node's ranks on a spare, while the survivors wait in their processes.

    python -m trainflow.stages.train_segment parallel=dp2 cluster.allocation.spare_nodes=1 resilience.recovery=peers \
        fault.step=3 fault.rank=1 fault.signal=KILL

A step's ranks run without --kill-on-bad-exit (locally, without the controller's kill): one rank's end leaves the
others running, and their failed collective is how they learn of it. The supervisor waits for every rank of the broken
generation to report or be seen ended (srun's or the local controller's line for its task, a replacement's process
ending) for at most resilience.failure_detect_s; a rank that neither reports nor ends by then is taken for lost (a
vanished node: it will find itself replaced if it ever reports). The ranks of a failed rank's node are replaced (the
node is the unit a spare replaces; a live rank among them exits), each given the live data-parallel replica that
sends it its state. It refuses (the ranks then end, and the step's failure goes the job-level way: launch.supervisor)
where no rank left (the error is the ranks' own), no spare answers, or a shard has no live replica.

Each recovery is two lines of the jobs ledger: the broken generation's failure (JobRun.generation; its verdict says
how it was recovered, its left_out the failed node) and, when the step ends or breaks again, the next generation's run:
submitted when the plan was posted, its failure-to-first-step time, the survivors' process ids and the bytes the ranks
read from checkpoint files meanwhile (recovery "peers").
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import logging
import os
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import submitit

from trainflow.checkpoint.folders import list_steps
from trainflow.config import ParallelDims, TrainflowConfig
from trainflow.host import hostname
from trainflow.journal import Journal
from trainflow.launch.failure import NODE_FAILURE, ends_in, read_markers
from trainflow.launch.heartbeat import beat_key
from trainflow.launch.job_end import LaunchError, task_results
from trainflow.launch.peers import JOINS, STORE, Broken, RecoveryPlan, generation_key, replica_source
from trainflow.launch.rejoin import RANK_BASE, WORLD
from trainflow.launch.restart import job_run
from trainflow.launch.slurm_nodes import node_states, usable_spares
from trainflow.launch.steps import Steps, answering, srun_step
from trainflow.records import RecordError
from trainflow.resilience.ledger import FaultClass, JobOutcome, JobRun

log = logging.getLogger(__name__)

POLL_S = 0.1
"""How often the supervisor looks for a broken generation in its store."""


@dataclass
class Generation:
    """What the supervisor knows of the generation running now."""

    number: int
    started: float
    """When it began: the step's first ranks' start, or the plan that began it."""
    failed_at: float = 0.0
    """When the generation before it broke (its first rank's report); 0 for the step's first."""
    kept: dict[str, int] = field(default_factory=dict)
    """Survivor rank (as text) -> its process id as it reported the break."""
    read_before: dict[int, int] = field(default_factory=dict)
    """Rank -> the bytes it had read from checkpoint files when the generation before broke."""


@dataclass
class PeerRecovery:
    """One job step's recoveries from peers: its store, its generations, its replacement ranks."""

    cfg: TrainflowConfig
    steps: Steps
    hosts: list[str]
    """The step's hosts, by node index (rank // tasks per node): a replaced node's entry becomes its spare."""
    spares: list[str]
    ledger: Journal
    fields: dict
    """job_run's fields of the step's records (attempt, submitted, exclude)."""
    job_id: str
    """<job>.<step>: the ledger's name of the step."""

    def __post_init__(self) -> None:
        import torch.distributed as dist

        self.store = dist.TCPStore("0.0.0.0", 0, is_master=True, wait_for_workers=False)
        self.env = {STORE: f"{os.environ.get('SLURMD_NODENAME') or hostname()}:{self.store.port}"}
        self.world = self.cfg.parallel.world_size
        self.per_node = self.world // len(self.hosts)
        p, t = self.cfg.parallel, self.cfg.train
        self.dims = ParallelDims.from_config(p, self.cfg.model, world_size=self.world, global_batch=t.global_batch)
        self.now = Generation(0, self.fields["submitted"])
        self.replacements: list[tuple[subprocess.Popen, list[int]]] = []
        self.done = threading.Event()
        self.job: submitit.Job | None = None

    def wait(self, job: submitit.Job) -> list:
        """Every rank's result once the step and its replacement ranks ended, recovering each broken generation
        meanwhile; a LaunchError holding the failure otherwise (a recovery refused among them)."""
        self.job = job
        watcher = threading.Thread(target=self.watch, name="trainflow-peers", daemon=True)
        watcher.start()
        try:
            try:
                return self.steps.wait(job)
            except LaunchError:
                for process, _ in self.replacements:  # a replacement's ranks outlive the step's first processes
                    process.wait()
                return task_results(job, self.cfg.cluster.allocation.executor)
        finally:
            self.done.set()
            watcher.join()

    def watch(self) -> None:
        while not self.done.wait(POLL_S):
            if int(self.store.add(generation_key(self.now.number, "broken"), 0)):
                self.recover()

    def last(self, run: JobRun) -> JobRun:
        """The ledger's line of the step's last generation, from the step's record `run`."""
        return self.generation_run(run) if self.now.number else run

    def generation_run(self, run: JobRun) -> JobRun:
        """A recovered generation's line: from the plan that began it, with its failure-to-first-step time, the
        survivors' process ids and the bytes its ranks read from checkpoint files since the break."""
        now, markers = self.now, read_markers(self.job).values()
        firsts = [m.first_step for m in markers if m.first_step and m.first_step > now.failed_at]
        read = sum(max(m.checkpoint_bytes - now.read_before.get(m.rank, 0), 0) for m in markers)
        return dataclasses.replace(
            run,
            submitted=now.started,
            started=now.started,
            generation=now.number,
            recovery="peers",
            first_step_s=min(firsts) - now.failed_at if firsts else None,
            kept_pids=now.kept,
            checkpoint_bytes_read=read,
            parts={},
        )

    def recover(self) -> None:
        """Plan the broken generation's next one, start its replacement ranks, and record the broken one."""
        job, number, seen = self.job, self.now.number, time.time()
        reports, ends, alive = self.collect()
        missing = sorted(set(range(self.world)) - set(reports) - alive)
        plan = self.plan(reports, missing, alive)
        hosts = {r: m.host for r, m in read_markers(job).items()}  # before a replacement rewrites its rank's marker
        said = [f"rank {r} on host {hosts.get(r, '?')} {ends.get(r, 'did not report')}" for r in missing]
        self.store.set(generation_key(number, "plan"), json.dumps(plan.to_json()))
        if plan.refused:
            log.warning("No recovery from peers after generation %d (%s): %s", number, "; ".join(said), plan.refused)
            self.now = Generation(number + 1, seen)  # none follows: the ranks end, the step's failure is judged
            return
        nodes = sorted({r // self.per_node for r in plan.replaced})
        out = [self.hosts[n] for n in nodes]
        for n in nodes:
            self.hosts[n] = self.spares.pop(0)
            ranks = list(range(n * self.per_node, (n + 1) * self.per_node))
            self.replacements += self.start(ranks, self.hosts[n], plan.generation)
        sources = ",".join(str(plan.sources[str(r)]) for r in plan.replaced)
        held = "the snapshots held by " if plan.snapshot else ""
        verdict = (
            f"recovered from peers: rank(s) {','.join(map(str, plan.replaced))} started on "
            f"{','.join(self.hosts[n] for n in nodes)}, "
            + (
                f"their state from {held}rank(s) {sources} at step {plan.step}"
                if plan.step >= 0
                else "every rank loading the newest checkpoint (the survivors' steps differ)"
            )
        )
        run = job_run(self.cfg, job, failure=None, step=self.step_index, job_id=self.job_id, **self.fields)
        broken = dataclasses.replace(
            self.generation_run(run) if number else run,
            ended=seen,
            outcome=JobOutcome.DIED,
            line="; ".join(said),
            verdict=verdict,
            left_out=out,
            fault=FaultClass.UNCONFIRMED,
        )
        self.ledger.append(broken)
        log.warning("Generation %d broke (%s); %s", number, "; ".join(said), verdict)
        pids = {r: m.pid for r, m in read_markers(job).items() if r in alive} | {r: b.pid for r, b in reports.items()}
        kept = {str(r): pid for r, pid in sorted(pids.items()) if r not in plan.replaced}
        read = {r: b.checkpoint_bytes for r, b in reports.items()}
        failed_at = min((b.at for b in reports.values()), default=seen)
        self.now = Generation(plan.generation, time.time(), failed_at, kept, read)

    @property
    def step_index(self) -> int:
        return int(self.job_id.rpartition(".")[2])

    def collect(self) -> tuple[dict[int, Broken], dict[int, str], set[int]]:
        """The reports of the broken generation's ranks, how each rank that ended did, and the ranks alive without a
        report: until every rank did one or the other, or beats on (a rank waiting in a collective with survivors
        only, which gloo cannot abort: launch.peers; it leaves once a replaced rank exits, and reports then), or
        resilience.failure_detect_s passed."""
        number, start = self.now.number, time.monotonic()
        short, settle = self.cfg.resilience.failure_detect_s, 2 * self.cfg.resilience.heartbeat_s + 1
        beats, alive = self.beats(number), set()
        reports: dict[int, Broken] = {}
        while True:
            alive |= {r for r, beat in self.beats(number).items() if beat != beats.get(r)}
            for rank in set(range(self.world)) - set(reports):
                key = generation_key(number, f"broken/{rank}")
                if self.store.check([key]):
                    try:
                        reports[rank] = Broken.from_json(json.loads(self.store.get(key)), where=key)
                    except (ValueError, RecordError) as err:
                        log.warning("Rank %d's report does not read (%s): taken for lost", rank, err)
            ends = self.ended()
            waiting, waited = set(range(self.world)) - set(reports) - set(ends), time.monotonic() - start
            if not waiting or (waiting <= alive and waited > settle) or waited > short:
                return {r: b for r, b in reports.items() if r not in ends}, ends, waiting & alive
            time.sleep(POLL_S)

    def beats(self, number: int) -> dict[int, bytes]:
        """Each rank's heartbeat in generation `number` (launch.heartbeat, in this store): one that changes is alive."""
        keys = [generation_key(number, f"heartbeat/{beat_key(r)}") for r in range(self.world)]
        with contextlib.suppress(Exception):  # a beat not yet seeded
            return dict(enumerate(self.store.multi_get(keys)))
        return {}

    def ended(self) -> dict[int, str]:
        """Rank -> how it ended, for the ranks of the generation that ended: the step's log's lines (srun's, the
        local controller's) for its first ranks, a replacement's process's end for later ones."""
        replaced = {r for _, ranks in self.replacements for r in ranks}
        text = self.job.paths.stderr.read_text(errors="replace") if self.job.paths.stderr.exists() else ""
        ends = {r: what for r, (_, what) in ends_in(text).items() if r not in replaced}
        if failed := set(NODE_FAILURE.findall(text)):  # srun's word for a node Slurm lost: its ranks went with it
            on = {r: m.host for r, m in read_markers(self.job).items()}
            ends |= {r: f"was lost: node {h} failed" for r, h in on.items() if h in failed and r not in replaced}
        for process, ranks in self.replacements:
            if (code := process.poll()) is not None:
                ends.update({r: f"exited with code {code}" for r in ranks})
        return ends

    def plan(self, reports: dict[int, Broken], missing: list[int], alive: set[int]) -> RecoveryPlan:
        """The next generation's plan, or a refusal saying why none follows."""
        number = self.now.number + 1

        def refused(why: str) -> RecoveryPlan:
            return RecoveryPlan(generation=number, replaced=[], step=-1, sources={}, refused=why)

        if not missing:
            return refused("every rank reported its error and none left: the error is the ranks' own")
        nodes = sorted({r // self.per_node for r in missing})
        replaced = [r for n in nodes for r in range(n * self.per_node, (n + 1) * self.per_node)]
        spares = usable_spares(self.spares, node_states(self.cfg.cluster.allocation.executor))
        self.spares = answering(self.steps, spares)
        if len(self.spares) < len(nodes):
            return refused(f"{len(nodes)} node(s) to replace and {len(self.spares)} spare(s) that answer")
        sources = {str(r): replica_source(r, self.dims, set(replaced)) for r in replaced}
        if None in sources.values():
            lost = next(r for r, s in sources.items() if s is None)
            if not self.cfg.checkpoint.snapshot_steps:
                return refused(f"no live data-parallel replica holds rank {lost}'s shard")
            return self.from_snapshots(reports, replaced, alive, refused)
        steps = {b.step for r, b in reports.items() if r not in replaced}
        step = steps.pop() if len(steps) == 1 and -1 not in steps else -1
        return RecoveryPlan(generation=number, replaced=replaced, step=step, sources=sources)

    def from_snapshots(
        self, reports: dict[int, Broken], replaced: list[int], alive: set[int], refused: Callable
    ) -> RecoveryPlan:
        """Every rank back to the peer snapshots' step (train.snapshots): each replaced rank's from its partner, the
        rank of its local index on the next node, live; every survivor's own of the same step (as reported: a rank
        alive without a report sends what it holds, which its replacement checks against the plan's step). A newer
        checkpoint than that step: every rank loads it instead, in process."""
        holders = {str(r): (r + self.per_node) % self.world for r in replaced}
        if lost := [r for r, h in holders.items() if h in replaced or (h not in reports and h not in alive)]:
            return refused(f"no live replica holds rank {lost[0]}'s shard, nor a live partner its snapshot")
        complete = [set(b.snapshots) for r, b in reports.items() if r not in replaced]
        if not (common := set.intersection(*complete) if complete else set()):
            return refused("no live replica holds a lost shard, and no snapshot step is complete on every rank left")
        step, number = max(common), self.now.number + 1
        if (saved := list_steps(Path(self.cfg.io.checkpoints))) and saved[-1] > step:
            return RecoveryPlan(generation=number, replaced=replaced, step=-1, sources=holders)
        return RecoveryPlan(generation=number, replaced=replaced, step=step, sources=holders, snapshot=True)

    def start(self, ranks: list[int], host: str, generation: int) -> list[tuple[subprocess.Popen, list[int]]]:
        """The replacement ranks `ranks` (one node's) on `host`, joining `generation`, in the step's folder: a Slurm
        job step, or on one machine a process per rank."""
        job, a = self.job, self.cfg.cluster.allocation
        env = {**os.environ, **self.env, JOINS: str(generation), WORLD: str(self.world)}
        module = ["trainflow.launch.rejoin", str(job.paths.folder)]
        log.info("Starting ranks %s on %s for generation %d", ",".join(map(str, ranks)), host, generation)
        if a.executor == "local":
            return [(local_rank(job, rank, env, module), [rank]) for rank in ranks]
        logs = f"{job.paths.folder}/%j_g{generation}_%t_log"
        command = srun_step(a, [host], len(ranks), job.paths.folder, logs=logs, module=module, keep=True)
        with open(job.paths.stderr, "ab") as err:  # srun's own lines beside the step's
            return [(subprocess.Popen(command, stdout=err, stderr=err, env={**env, RANK_BASE: str(ranks[0])}), ranks)]


def local_rank(job: submitit.Job, rank: int, env: dict, module: list[str]) -> subprocess.Popen:
    """One machine's replacement rank: a process with submitit's local task variables of the step's job (one node to
    submitit: its local rank is its rank, so the energy meter stays with rank 0's)."""
    paths = job.task(rank).paths
    variables = {
        "SUBMITIT_EXECUTOR": "local",
        "SUBMITIT_LOCAL_JOB_ID": str(job.job_id),
        "SUBMITIT_LOCAL_LOCALID": str(rank),
        "SUBMITIT_LOCAL_NODEID": "0",
        "SUBMITIT_LOCAL_JOB_NUM_NODES": "1",
        RANK_BASE: str(rank),
    }
    with open(paths.stdout, "ab") as out, open(paths.stderr, "ab") as err:
        command = [sys.executable, "-u", "-m", *module]
        return subprocess.Popen(command, stdout=out, stderr=err, env={**env, **variables})
