"""Train one segment of the campaign as a submitit job (one task per rank) and wait for it.

    python -m trainflow.stages.train_segment segment=0 parallel=tp2 train.segment_steps=20

The job is a `submitit.helpers.Checkpointable`: on Slurm's pre-timeout or preemption signal every
rank agrees at the next step boundary, the checkpoint is written, and submitit requeues the job,
which resumes from that checkpoint. `checkpoint()` returns a fresh instance: no tensors pickled.

Before it submits anything the stage checks the config against the campaign in the run folder (trainflow.campaign:
the same model, the series' seed, a branch's checkpoint); a segment the series' lineage holds as complete trains
nothing and has its outputs restored from what was kept (train.kept). A completed segment keeps its summary, with its
lineage: what it continued from, the settings and code its jobs changed.
"""

from __future__ import annotations

import dataclasses
import functools
import os
import signal
import sys
from collections.abc import Callable
from pathlib import Path

import submitit
import torch
import torch.distributed as dist

from trainflow.campaign.check import check_campaign, start_series
from trainflow.campaign.segments import segment_span
from trainflow.checkpoint.state import state_bytes
from trainflow.config import TrainflowConfig
from trainflow.config.run_folder import RunFolder
from trainflow.energy.dvfs import PHASES
from trainflow.energy.meter import cpu_seconds
from trainflow.energy.metrics import StageFigures
from trainflow.energy.node import NodeWindow, actions_taken, node_window, sum_nodes
from trainflow.errors import TrainflowError
from trainflow.host import hostname
from trainflow.journal import Journal
from trainflow.launch import distributed_task, peers
from trainflow.launch.heartbeat import Heartbeat
from trainflow.launch.peers import PLAN_MARGIN_S, PeerLost
from trainflow.launch.segment_jobs import run_jobs
from trainflow.launch.task import TaskNotes, configure_logging, mark_part, marked_task, task_device
from trainflow.resilience.arrivals import drilled_hosts, start_clock
from trainflow.resilience.goodput import Span, measure_goodput, segment_jobs
from trainflow.resilience.ledger import jobs_ledger
from trainflow.stack import NodeStack, per_node, versions
from trainflow.stage import StageError, stage_log, stage_main, write_json
from trainflow.train.adopt import adopt_legacy
from trainflow.train.kept import keep_segment, lineage_of, restore_segment
from trainflow.train.peer_state import KeptState, restored
from trainflow.train.run_terms import write_terms
from trainflow.train.snapshots import PeerSnapshots
from trainflow.train.summary import RankEnergy, RankResult, SegmentSummary
from trainflow.train.trainer import Trainer

log = stage_log(__file__)


class TrainSegment(submitit.helpers.Checkpointable):
    def __init__(self, cfg: TrainflowConfig, attempt: int = 0) -> None:
        self.cfg, self.attempt = cfg, attempt
        """Which job of the segment this is (0: the first; a restart after a failure counts up)."""

    def __call__(self) -> RankResult:
        summary, window = self.with_peers() if os.environ.get(peers.STORE) else self.in_one_group()
        if summary.interrupted_by:
            self.stop(summary.interrupted_by)
        # Each rank's own CPU time (its whole process: the task is started for this job), and the node's counters
        # (NVML, RAPL) only from its local rank 0's window.
        energy = RankEnergy(cpu_s=cpu_seconds(), node=window.result())
        stack = NodeStack(hostname(), versions())
        return RankResult(summary=summary, energy=energy, stack=stack, slurm_job_id=os.environ.get("SLURM_JOB_ID"))

    def in_one_group(self) -> tuple[SegmentSummary, NodeWindow]:
        """Train in one process group for the job's life: a rank that dies ends the job (launch.restart)."""
        cfg, env = self.cfg, submitit.JobEnvironment()
        with (
            distributed_task(cfg.cluster.runtime) as (rank, world, device, marker),
            node_window(
                cfg.energy, local_rank=env.local_rank, folder=RunFolder.of(cfg).power, segment=cfg.segment
            ) as window,
            Heartbeat.start(cfg.cluster.runtime, cfg.resilience, rank=rank, world=world, paths=env.paths) as beat,
        ):
            return self.noted(
                beat, marker, lambda: self.trainer(device, beat, window, attempt=self.attempt).train()
            ), window

    def with_peers(self) -> tuple[SegmentSummary, NodeWindow]:
        """Train in generations of process groups (resilience.recovery=peers, launch.peers): where a peer dies, this
        rank keeps its process and its state, and goes on in the next generation, or exits where its node is
        replaced."""
        cfg, env, runtime = self.cfg, submitit.JobEnvironment(), self.cfg.cluster.runtime
        configure_logging()
        power = RunFolder.of(cfg).power
        with (
            marked_task() as marker,
            node_window(cfg.energy, local_rank=env.local_rank, folder=power, segment=cfg.segment) as window,
        ):
            device = task_device(runtime, submitit.helpers.TorchDistributedEnvironment())
            link = peers.PeerLink(env.global_rank, env.num_tasks, runtime)
            every, nodes = cfg.checkpoint.snapshot_steps, cfg.cluster.allocation.nodes
            snapshots = PeerSnapshots(every, link.rank, link.world, link.world // nodes) if every else None
            kept = None
            while True:
                with (
                    link.group(device),
                    Heartbeat.start(
                        runtime,
                        cfg.resilience,
                        rank=link.rank,
                        world=link.world,
                        paths=env.paths,
                        store=link.prefixed("heartbeat"),
                    ) as beat,
                ):
                    trainer = None
                    try:
                        trainer = self.trainer(device, beat, window, attempt=self.attempt + link.generation)
                        if snapshots is not None:  # a group of the generation's own, made by every rank alike
                            snapshots.attach(dist.new_group(backend="gloo"))
                            if link.generation == 0:  # survivors later hold theirs already
                                snapshots.check_memory(state_bytes(trainer.model.named_parts()))
                        trainer.snapshots = snapshots
                        resumed = restored(trainer, link.rank, kept, link.plan, snapshots)
                        return self.noted(beat, marker, functools.partial(trainer.train, resumed)), window
                    except RuntimeError as err:
                        if isinstance(err, TrainflowError):
                            raise
                        log.warning("Rank %d lost its generation %d: %s", link.rank, link.generation, err)
                        link.abort()
                        kept = KeptState.of(trainer) or kept
                        error = PeerLost(f"{type(err).__name__}: {err}")  # not its traceback: it holds the trainer
                        trainer = None
                # The supervisor waits up to a collective timeout for a rank that beats on, then probes its spares.
                wait_s = runtime.collective_timeout_s + cfg.resilience.failure_detect_s + PLAN_MARGIN_S
                held = snapshots.steps() if snapshots else []
                plan = link.broken(-1 if kept is None else kept.boundary.step, error, wait_s, held)
                if link.rank in plan.replaced:
                    log.warning("Rank %d leaves: its node is replaced in generation %d", link.rank, plan.generation)
                    os._exit(peers.REPLACED_EXIT)
                log.warning("Rank %d goes on in generation %d after %s", link.rank, plan.generation, error)

    def trainer(self, device: torch.device, beat: Heartbeat, window: NodeWindow, *, attempt: int) -> Trainer:
        def on_phase(kind: str, step: int) -> None:
            beat.progress(kind, step)
            if kind in PHASES:  # the DVFS policy acts on the steps' data and compute phases only
                window.enter(kind)

        on_part = functools.partial(mark_part, submitit.JobEnvironment().paths)  # the start-up's parts, in the marker
        return Trainer(self.cfg, device, on_phase=on_phase, on_step=beat.timed, on_part=on_part, attempt=attempt)

    def noted(self, beat: Heartbeat, marker: TaskNotes, train: Callable[[], SegmentSummary]) -> SegmentSummary:
        """`train`'s summary; where it raises, the step it failed at noted in the task's marker first (the restart's
        judge: out of memory twice at one step)."""
        try:
            return train()
        except BaseException:
            marker.step = beat.step
            raise

    def stop(self, signame: str) -> None:
        """After the agreed checkpoint every task ends without a result. On USR2 (Slurm's pre-timeout or
        preemption signal) submitit's handler first requeues the job, on rank 0; SIGTERM is Slurm ending the job
        (scancel, its time limit), and a requeue would undo a cancel."""
        handler = signal.getsignal(signal.SIGUSR2)
        if signame == "SIGUSR2" and callable(handler):
            handler(signal.SIGUSR2, None)  # rank 0: checkpoint() -> requeue -> exit; other ranks return
            log.info("Stopped for requeue after %s", signame)
            sys.exit(0)  # a clean exit: a failing one would end rank 0 before it requeued (srun's --kill-on-bad-exit)
        log.info("Stopped after %s without a requeue: the job is being ended", signame)
        sys.exit(-1)

    def checkpoint(self) -> submitit.helpers.DelayedSubmission:
        # The trainer has already saved at the agreed step boundary: resubmit the same config.
        return submitit.helpers.DelayedSubmission(TrainSegment(self.cfg, self.attempt))


def drill(cfg: TrainflowConfig) -> dict:
    """Where fault.mtbf_s injects failures at a rate: the campaign's clock started before its first job
    (resilience.arrivals), and run_jobs' `excused`, which lets later jobs use again the hosts only the drill's failures
    were blamed on (resilience.arrivals.drilled_hosts). Nothing otherwise: a campaign without a drill reads no
    faults.jsonl, so no file in the run folder can excuse a host a real failure blamed."""
    if not cfg.fault.mtbf_s:
        return {}
    ledger = Path(RunFolder.faults_log(cfg.io.checkpoints))
    start_clock(ledger, mtbf_s=cfg.fault.mtbf_s, seed=cfg.fault.seed, hang_share=cfg.cluster.hardware.hang_share)
    return {"excused": functools.partial(drilled_hosts, ledger)}


def run(cfg: TrainflowConfig) -> StageFigures | None:
    adopt_legacy(cfg)  # a run folder of trainflow before campaign records: its series becomes the campaign's
    check_campaign(cfg)
    span = segment_span(cfg)
    if span.done is not None:
        return None if restore_segment(cfg, span) else StageFigures()
    start_series(cfg)
    results: list[RankResult] = run_jobs(cfg, functools.partial(TrainSegment, cfg), **drill(cfg))
    summary = results[0].summary
    if not summary.completed:
        raise StageError(f"segment {cfg.segment} stopped at step {summary.end_step} before its end; rerun it to resume")
    if not summary.steps or not summary.evals:
        raise StageError(
            f"{cfg.io.checkpoints} holds the checkpoint of step {summary.end_step} but not the step records of "
            f"segment {cfg.segment} (steps.jsonl); delete {cfg.io.checkpoints} to retrain from scratch"
        )
    log.info(
        "Trained segment %d: steps %d-%d, final loss %.4f, validation loss %.4f, %.0f tokens/s/device",
        *(cfg.segment, summary.start_step, summary.end_step, summary.steps[-1].loss, summary.evals[-1].val_loss),
        summary.speed.tokens_per_s_per_device,
    )
    windows = [r.energy.node for r in results if r.energy.node]
    for action in actions_taken(windows):
        log.info("Energy: %s", action)
    jobs = segment_jobs(jobs_ledger(cfg.io.checkpoints).read(), cfg.segment)
    goodput = measure_goodput(jobs, Journal(RunFolder.spans_log(cfg.io.checkpoints), Span).read())
    log.info(
        "Goodput of segment %d: %.1f %% of %.1f s over %d job(s)",
        *(cfg.segment, 100 * goodput.goodput, goodput.wall_s, len(jobs)),
    )
    summary = dataclasses.replace(
        summary,
        goodput=goodput,
        slurm_job_id=results[0].slurm_job_id,
        stack=per_node(r.stack for r in results),
        lineage=lineage_of(cfg, span, summary),
    )
    for change in summary.lineage.changes:
        log.info("Segment %d changed from step %d: %s", cfg.segment, change.step, change.change.line())
    keep_segment(cfg, summary)  # complete from here: a rerun restores the outputs below
    write_json(cfg.io.segment_report, summary.to_json())
    write_terms(cfg, summary)  # the campaign's measured terms so far: python -m trainflow.plan --from-run
    return StageFigures(
        ranks=len(results),
        rank_cpu_s=sum(r.energy.cpu_s for r in results),
        nodes=sum_nodes(windows),
        node_windows=windows,
        slurm_job_id=summary.slurm_job_id,
        tokens=(summary.end_step - summary.start_step) * cfg.train.global_batch * cfg.model.seq_len,
    )


def kept_metrics(cfg: TrainflowConfig) -> str:
    """Where the stage's metrics are kept beside the segment's checkpoints, for a rerun to restore (train.kept)."""
    return RunFolder.kept_metrics(cfg.io.checkpoints, cfg.segment)


if __name__ == "__main__":
    stage_main(run, config_name="train_segment", keep=kept_metrics)
