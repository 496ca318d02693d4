"""Check that every checkpoint of the run is complete (its folder holds exactly the files its manifest
lists, every rank's among them) and re-read every file against the manifest's CRC-32C.

    python -m trainflow.stages.verify_checkpoint io.checkpoints=runs/default/capacity/checkpoints/<hash>
"""

from __future__ import annotations

import time
from pathlib import Path

import hydra
from omegaconf import DictConfig

from trainflow.checkpoint.folders import list_steps, step_dir
from trainflow.checkpoint.manifest import ChecksumError, verify
from trainflow.config import CONF_DIR, TrainflowConfig
from trainflow.stage import StageError, run_stage, stage_log, write_json

log = stage_log(__file__)


def verify_all(root: Path) -> dict:
    steps = list_steps(root)
    if not steps:
        raise StageError(f"{root} holds no checkpoint; run train_segment first")
    start = time.perf_counter()
    checked, failures, files, nbytes = [], [], 0, 0
    for step in steps:
        try:
            result = verify(step_dir(root, step))
            files += result["files"]
            nbytes += result["bytes"]
            checked.append({"step": step, **result})
        except ChecksumError as err:
            failures.append({"step": step, "error": str(err)})
    seconds = time.perf_counter() - start
    report = {
        "checkpoints": checked,
        "failures": failures,
        "files": files,
        "bytes": nbytes,
        "seconds": seconds,
        "gb_per_s": nbytes / seconds / 1e9 if seconds else None,
        "algorithm": "crc32c",
    }
    log.info(
        "Verified %d checkpoints, %d files, %.1f MB in %.2f s: %d invalid",
        len(steps),
        files,
        nbytes / 1e6,
        seconds,
        len(failures),
    )
    if failures:
        raise StageError(f"{len(failures)} checkpoint(s) failed verification, first: {failures[0]['error']}")
    return report


def run(cfg: TrainflowConfig) -> dict:
    report = verify_all(Path(cfg.io.checkpoints))
    write_json(cfg.io.verify_report, report)
    return {"bytes": report["bytes"]}


@hydra.main(version_base="1.3", config_path=str(CONF_DIR), config_name="verify_checkpoint")
def main(raw: DictConfig) -> None:
    run_stage(raw, run)


if __name__ == "__main__":
    main()
