"""Compile the fp8 kernels the campaign's ranks will dispatch into the run's build cache, once, before the gate
(trainflow.fp8.build); ranks only load from it. A no-op, saying why in one line, without fp8, a GPU, a CUDA
toolkit or a CUDA build of torch.

    python -m trainflow.stages.build_kernels train.fp8=delayed
"""

from __future__ import annotations

import logging
from pathlib import Path

from trainflow.config import TrainflowConfig
from trainflow.energy.metrics import StageFigures
from trainflow.fp8.build import build_campaign_kernels
from trainflow.stage import stage_main, write_json

log = logging.getLogger(__name__)


def run(cfg: TrainflowConfig) -> StageFigures:
    report = build_campaign_kernels(cfg.train.fp8, Path(cfg.io.kernel_cache))
    log.info("build_kernels %s: %s", report.outcome.value, report.reason)
    write_json(cfg.io.kernels_report, report.to_json())
    return StageFigures({"outcome": report.outcome.value})


if __name__ == "__main__":
    stage_main(run, config_name="build_kernels")
