"""What a resume restores besides the tensors: the training stream's position, the learning-rate schedule, and the
settings the checkpoint was trained with, against which this job's changes are recorded (its lineage).

    position = stream_position(manifest, step, cfg, weights)     # data.stream: format 1 migrated from its windows
    schedule = resumed_schedule(manifest, cfg, horizon=span.horizon, step=step)
    changed = changes(recorded_settings(manifest), job_settings(cfg, schedule))
"""

from __future__ import annotations

from typing import Any

from trainflow.checkpoint.manifest import Manifest
from trainflow.code_version import CodeVersion
from trainflow.config import TrainflowConfig
from trainflow.config.identity import Change, settings
from trainflow.config.phases import CARRIED
from trainflow.config.schedule import Schedule
from trainflow.data.stream import StreamPosition, migrated

SCHEDULE = "lr schedule"
"""The schedule's key among a job's settings: its line changes where a new horizon re-anchored it."""


def stream_position(
    manifest: Manifest | None, step: int, cfg: TrainflowConfig, weights: dict[str, float]
) -> StreamPosition:
    """Where the stream stands after checkpoint `step` (its manifest's position; a format-1 manifest's is derived from
    its step and skipped windows at the configured batch, which its series could not change); from the start where
    nothing was loaded."""
    batch, seed = cfg.train.global_batch, cfg.train.seed
    if manifest is None:
        return StreamPosition.start(block=batch, names=list(weights))
    if manifest.stream is not None:
        return manifest.stream
    return migrated(step, manifest.legacy_windows or [], batch=batch, weights=weights, seed=seed)


def resumed_schedule(manifest: Manifest | None, cfg: TrainflowConfig, *, horizon: int, step: int) -> Schedule:
    """The schedule from `step` on: the checkpoint's, reconciled with the config and the plan's horizon
    (config.schedule); the config's plain one where the checkpoint records none."""
    if manifest is None or manifest.schedule is None:
        return Schedule.of(cfg.optim, horizon=horizon)
    return manifest.schedule.resumed(cfg.optim, horizon=horizon, at=step)


def job_settings(cfg: TrainflowConfig, schedule: Schedule) -> dict[str, Any]:
    """What this job trains with, as its changes compare it: the settings, the code and the schedule."""
    return {**settings(cfg), **CodeVersion.here().as_settings(), SCHEDULE: schedule.line()}


def recorded_settings(manifest: Manifest | None) -> dict[str, Any] | None:
    """The same of the job that wrote the checkpoint; None where it recorded none (format 1, another tool)."""
    if manifest is None or manifest.settings is None:
        return None
    code = manifest.code.as_settings() if manifest.code else {}
    schedule = {SCHEDULE: manifest.schedule.line()} if manifest.schedule else {}
    return {**manifest.settings, **code, **schedule}


def carried_changes(manifest: Manifest, cfg: TrainflowConfig) -> list[Change]:
    """What a later phase changed of the identity its parent's checkpoint carries into it (config.phases.CARRIED:
    rotary scaling), as changes of the phase's lineage: the settings leave the identity out."""
    recorded = manifest.model if isinstance(manifest.model, dict) else {}
    keys = [k.removeprefix("model.") for k in CARRIED if k.startswith("model.")]
    return [
        Change(f"model.{k}", recorded[k], getattr(cfg.model, k))
        for k in keys
        if k in recorded and recorded[k] != getattr(cfg.model, k)
    ]
