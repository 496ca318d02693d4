"""Check that every checkpoint of the run is complete and re-read every file against the manifest's CRC-32C
(trainflow.checkpoint.verify), writing verify.json.

    python -m trainflow.stages.verify_checkpoint io.checkpoints=runs/default/capacity/checkpoints/<series>
"""

from __future__ import annotations

from trainflow.checkpoint.verify import verify_all
from trainflow.config import TrainflowConfig
from trainflow.energy.metrics import StageFigures
from trainflow.stage import stage_main, write_json


def run(cfg: TrainflowConfig) -> StageFigures:
    report = verify_all(cfg.io.checkpoints)
    write_json(cfg.io.verify_report, report.to_json())
    return StageFigures({"bytes": report.bytes})


if __name__ == "__main__":
    stage_main(run, config_name="verify_checkpoint")
