"""What every stage shares: config from Hydra, one-line errors, and the job's metrics file.

A stage module is `run(cfg) -> StageFigures` plus a two-line `stage_main` call; `run_stage` validates the config,
runs the pre-flight checks (trainflow.preflight), meters the job (wall, CPU, RAPL/NVML energy where readable) and
writes `io.job_metrics` (trainflow.energy.metrics.JobMetrics: the StageFigures run() reported, with the resolved
config the job ran with), which `account_energy` and `report` read. A run() that finds its work already done and
restores its outputs from where they were kept returns None: nothing was measured, and no metrics are written over
the kept ones.
"""

from __future__ import annotations

import argparse
import dataclasses
import functools
import logging
import os
import sys
from collections.abc import Callable
from pathlib import Path

from omegaconf import DictConfig

from trainflow.atomic import write_json, write_text_atomic  # noqa: F401  (re-exported for the stages)
from trainflow.config import STAGES, TrainflowConfig, TrainflowError, as_dict, to_config
from trainflow.config.compose import compose_raw, job_logging
from trainflow.energy.meter import Reading, delta
from trainflow.energy.metrics import JobMetrics, StageFigures
from trainflow.preflight import preflight

log = logging.getLogger(__name__)


class StageError(TrainflowError):
    """A stage that ran and found its inputs or results unacceptable."""


def stage_log(module_file: str) -> logging.Logger:
    """A stage module's logger, named for its stage (trainflow.<stage>) whether it runs under `python -m` or is
    imported: its file name is the stage's name."""
    return logging.getLogger(f"trainflow.{Path(module_file).stem}")


def run_stage(
    raw: DictConfig,
    run: Callable[[TrainflowConfig], StageFigures | None],
    keep: Callable[[TrainflowConfig], str] | None = None,
) -> None:
    """Validate, pre-flight check, run and meter one stage; expected failures end in one error line and exit 1.
    `keep` names a second place the metrics are written, kept beside the work they measure (a training segment's)."""
    try:
        cfg = to_config(raw)
        preflight(cfg)  # the files and tools it names, again: they may have changed since the DAG was built
        start = Reading.now()
        figures = run(cfg)
        if figures is None:  # its work was done: run() restored its outputs, metrics included
            return
        if figures.slurm_job_id is None:
            figures = dataclasses.replace(figures, slurm_job_id=os.environ.get("SLURM_JOB_ID"))
        measured = delta(start, Reading.now())
        metrics = JobMetrics.of(
            figures, stage=cfg.stage, segment=cfg.segment, job=cfg.job or cfg.stage, config=as_dict(cfg), **measured
        )
        if keep is not None:
            write_json(keep(cfg), metrics.to_json())
        write_json(cfg.io.job_metrics, metrics.to_json())
    except TrainflowError as err:
        log.error("%s: %s", type(err).__name__, err)
        sys.exit(1)


def stage_main(run: Callable, *, config_name: str, keep: Callable[[TrainflowConfig], str] | None = None) -> None:
    """`python -m trainflow.stages.<stage> [OVERRIDE ...]`: the stage's config from its command line, then run_stage."""
    run_stage(command_line_config(config_name), run, keep)


@functools.cache
def command_line_config(config_name: str) -> DictConfig:
    """The config `python -m trainflow.stages.<config_name> [OVERRIDE ...]` gives, composed once and checked; a bad
    override ends in one error line and exit 1 (@hydra.main printed Hydra's 7-line message, which suggested `+key=`)."""
    parser = argparse.ArgumentParser(
        prog=f"python -m trainflow.stages.{config_name}",
        description=f"Run the {config_name} stage: conf/{config_name}.yaml, changed by Hydra overrides.",
    )
    parser.add_argument("overrides", nargs="*", help="Hydra overrides, as the workflow passes them (e.g. model=tiny)")
    overrides = parser.parse_args().overrides
    job_logging()
    try:
        raw = compose_raw(config_name, overrides)
        to_config(raw)  # the schema's keys and every domain, before the stage module's imports
    except TrainflowError as err:
        log.error("%s: %s", type(err).__name__, err)
        sys.exit(1)
    return raw


def check_command_line() -> None:
    """Compose the config of the stage this process runs, if it runs as `python -m trainflow.stages.<stage>`: the
    package calls this as Python imports it, before the stage's module (and torch, ~10 s for train_segment)."""
    if sys.argv[0] != "-m":  # runpy names the module's file in argv[0] once it has imported the package
        return
    module = sys.orig_argv[-len(sys.argv)].removeprefix("-m")  # `-m x` or `-mx`, then the module's arguments
    if (stage := module.removeprefix("trainflow.stages.")) in STAGES:
        command_line_config(stage)
