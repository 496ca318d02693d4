"""What every stage shares: config from Hydra, one-line errors, and the stage's metrics file.

A stage module is `run(cfg) -> dict` plus a three-line `@hydra.main`; `run_stage` validates the
config, meters the stage (wall, CPU, RAPL/NVML energy where readable) and writes
`io.stage_metrics` (with the resolved config the stage ran with), which `account_energy` and
`report` read.
"""

from __future__ import annotations

import json
import logging
import os
import sys
from collections.abc import Callable
from pathlib import Path

from omegaconf import DictConfig

from trainflow.atomic import write_json, write_text_atomic  # noqa: F401  (re-exported for the stages)
from trainflow.config import TrainflowConfig, TrainflowError, as_dict, to_config
from trainflow.energy.meter import Reading, delta

log = logging.getLogger(__name__)


class StageError(TrainflowError):
    """A stage that ran and found its inputs or results unacceptable."""


def stage_log(module_file: str) -> logging.Logger:
    """A stage module's logger, named for its stage (trainflow.<stage>) whether it runs under `python -m` or is
    imported: its file name is the stage's name."""
    return logging.getLogger(f"trainflow.{Path(module_file).stem}")


def read_json(path: str | Path) -> dict:
    """An earlier stage's JSON output; missing, it is one StageError naming the file and the fix."""
    path = Path(path)
    if not path.is_file():
        raise StageError(
            f"{path} is missing: the stage that writes it has not run; run the whole DAG or force that stage"
        )
    return json.loads(path.read_text())


def run_stage(raw: DictConfig, run: Callable[[TrainflowConfig], dict]) -> None:
    """Validate, run and meter one stage; expected failures end in one error line and exit 1."""
    try:
        cfg = to_config(raw)
        start = Reading.now()
        extra = run(cfg) or {}
        metrics = {
            "stage": cfg.stage,
            "segment": cfg.segment,
            "job": Path(cfg.io.stage_metrics).stem,  # prepare_data's tokenizer and shard jobs: tokenizer, shard-00003
            **delta(start, Reading.now()),
            "slurm_job_id": os.environ.get("SLURM_JOB_ID"),  # a light stage run as a Slurm job (account_energy)
            **extra,
            "config": as_dict(cfg),
        }
        write_json(cfg.io.stage_metrics, metrics)
    except TrainflowError as err:
        log.error("%s: %s", type(err).__name__, err)
        sys.exit(1)
