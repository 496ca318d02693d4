"""Check that every checkpoint of the run is complete and re-read every file against the manifest's CRC-32C
(trainflow.checkpoint.verify), writing verify.json.

    python -m trainflow.stages.verify_checkpoint io.checkpoints=runs/default/capacity/checkpoints/<hash>
"""

from __future__ import annotations

import hydra
from omegaconf import DictConfig

from trainflow.checkpoint.verify import verify_all
from trainflow.config import CONF_DIR, TrainflowConfig
from trainflow.energy.metrics import StageFigures
from trainflow.stage import run_stage, write_json


def run(cfg: TrainflowConfig) -> StageFigures:
    report = verify_all(cfg.io.checkpoints)
    write_json(cfg.io.verify_report, report.to_json())
    return StageFigures({"bytes": report.bytes})


@hydra.main(version_base="1.3", config_path=str(CONF_DIR), config_name="verify_checkpoint")
def main(raw: DictConfig) -> None:
    run_stage(raw, run)


if __name__ == "__main__":
    main()
