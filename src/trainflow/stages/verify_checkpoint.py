"""Check that every checkpoint of the run is complete and re-read every file against the manifest's CRC-32C
(trainflow.checkpoint.verify), writing verify.json: the series io.checkpoints names, and in a campaign of phases the
series of every phase before it (config.phases).

    python -m trainflow.stages.verify_checkpoint io.checkpoints=runs/default/capacity/checkpoints/<series>
"""

from __future__ import annotations

from trainflow.checkpoint.verify import merged, verify_all
from trainflow.config import TrainflowConfig
from trainflow.config.phases import phase_index
from trainflow.config.run_folder import RunFolder
from trainflow.energy.metrics import StageFigures
from trainflow.stage import stage_main, write_json


def run(cfg: TrainflowConfig) -> StageFigures:
    run_folder, k = RunFolder.of(cfg), phase_index(cfg)
    earlier = [run_folder.series_checkpoints(p.series) for p in cfg.phases[:k]]
    report = merged([verify_all(folder) for folder in [*earlier, cfg.io.checkpoints]])
    write_json(cfg.io.verify_report, report.to_json())
    return StageFigures({"bytes": report.bytes})


if __name__ == "__main__":
    stage_main(run, config_name="verify_checkpoint")
