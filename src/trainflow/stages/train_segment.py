"""Train one segment of the campaign as a submitit job (one task per rank) and wait for it.

    python -m trainflow.stages.train_segment segment=0 parallel=tp2 train.segment_steps=20

The job is a `submitit.helpers.Checkpointable`: on Slurm's pre-timeout or preemption signal every
rank agrees at the next step boundary, the checkpoint is written, and submitit requeues the job,
which resumes from that checkpoint. `checkpoint()` returns a fresh instance: no tensors pickled.
"""

from __future__ import annotations

import dataclasses
import os
import signal
import sys
from pathlib import Path

import hydra
import submitit
from omegaconf import DictConfig

from trainflow.checkpoint.manager import list_steps
from trainflow.config import CONF_DIR, TrainflowConfig
from trainflow.config.run_folder import RunFolder
from trainflow.energy.meter import cpu_seconds
from trainflow.energy.node import actions_taken, node_window, sum_nodes
from trainflow.launch import LaunchError, build_executor, distributed_task, run_job
from trainflow.stage import StageError, run_stage, stage_log, write_json
from trainflow.train.summary import RankEnergy, SegmentSummary
from trainflow.train.trainer import Trainer

log = stage_log(__file__)


class TrainSegment(submitit.helpers.Checkpointable):
    def __init__(self, cfg: TrainflowConfig) -> None:
        self.cfg = cfg

    def __call__(self) -> SegmentSummary:
        cfg, env = self.cfg, submitit.JobEnvironment()
        power = RunFolder.of(cfg).power
        with (
            distributed_task(cfg.cluster.runtime) as (_, _, device),
            node_window(cfg.energy, local_rank=env.local_rank, folder=power, segment=cfg.segment) as window,
        ):
            summary = Trainer(cfg, device, on_phase=window.enter).train()
        if summary.interrupted_by:
            self.stop(summary.interrupted_by)
        # Each rank's own CPU time (its whole process: the task is started for this job), and the node's counters
        # (NVML, RAPL) only from its local rank 0's window.
        energy = RankEnergy(cpu_s=cpu_seconds(), node=window.result())
        return dataclasses.replace(summary, energy=energy, slurm_job_id=os.environ.get("SLURM_JOB_ID"))

    def stop(self, signame: str) -> None:
        """After the agreed checkpoint every task ends without a result. On USR2 (Slurm's pre-timeout or
        preemption signal) submitit's handler first requeues the job, on rank 0; SIGTERM is Slurm ending the job
        (scancel, its time limit), and a requeue would undo a cancel."""
        handler = signal.getsignal(signal.SIGUSR2)
        if signame == "SIGUSR2" and callable(handler):
            handler(signal.SIGUSR2, None)  # rank 0: checkpoint() -> requeue -> exit; other ranks return
            log.info("Stopped for requeue after %s", signame)
        else:
            log.info("Stopped after %s without a requeue: the job is being ended", signame)
        sys.exit(-1)

    def checkpoint(self) -> submitit.helpers.DelayedSubmission:
        # The trainer has already saved at the agreed step boundary: resubmit the same config.
        return submitit.helpers.DelayedSubmission(TrainSegment(self.cfg))


def resume_point(cfg: TrainflowConfig) -> str:
    """Where a rerun of the segment starts: the newest checkpoint Trainer.resume looks for first."""
    end = (cfg.segment + 1) * cfg.train.segment_steps
    for root in filter(None, (cfg.io.checkpoints, cfg.io.resume_from)):
        if steps := [step for step in list_steps(Path(root)) if step <= end]:
            return f"rerunning the workflow resumes it from step {steps[-1]} (newest checkpoint in {root})"
    return f"{cfg.io.checkpoints} holds no checkpoint to resume it from"


def run(cfg: TrainflowConfig) -> dict:
    executor = build_executor(
        cfg.cluster.allocation,
        world_size=cfg.parallel.world_size,
        folder=cfg.io.submitit,
        name=f"{cfg.run}-train-{cfg.segment}",
    )
    try:
        results = run_job(executor, TrainSegment(cfg))
    except LaunchError as err:
        raise LaunchError(f"segment {cfg.segment} failed: {err}; {resume_point(cfg)}") from err
    summary: SegmentSummary = results[0]
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
        summary.tokens_per_s_per_device,
    )
    windows = [r.energy.node for r in results if r.energy and r.energy.node]
    for action in actions_taken(windows):
        log.info("Energy: %s", action)
    write_json(cfg.io.segment_report, summary.to_json())
    return {
        "ranks": len(results),
        "rank_cpu_s": sum(r.energy.cpu_s for r in results if r.energy),
        "nodes": sum_nodes(windows).to_json(),
        "node_windows": [w.to_json() for w in windows],
        "slurm_job_id": summary.slurm_job_id,
        "tokens": (summary.end_step - summary.start_step) * cfg.train.global_batch * cfg.model.seq_len,
    }


@hydra.main(version_base="1.3", config_path=str(CONF_DIR), config_name="train_segment")
def main(raw: DictConfig) -> None:
    run_stage(raw, run)


if __name__ == "__main__":
    main()
