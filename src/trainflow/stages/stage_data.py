"""Stage the token file from the capacity tier to the fast tier, verified by CRC.

    python -m trainflow.stages.stage_data io.tokens=/capstor/.../tokens.h5 io.staged_tokens=/iopsstor/.../tokens.h5

The source is first checked against the size and CRC-32C prepare_data recorded (data.record), so a
damaged capacity-tier file is never staged. An identical copy already on the fast tier is kept;
otherwise the file is copied to a temporary name, fsynced, re-read and checked, then renamed into
place, and its record written beside it.
"""

from __future__ import annotations

import logging
import shutil
import time
from pathlib import Path

import hydra
from omegaconf import DictConfig

from trainflow.config import CONF_DIR, TrainflowConfig
from trainflow.crc import file_crc
from trainflow.data.record import check_file, recorded, write_record
from trainflow.stage import StageError, run_stage

log = logging.getLogger("trainflow.stage_data")
RERUN_PREPARE = "prepare_data (snakemake --forcerun prepare_data)"


def stage_file(src: Path, dst: Path) -> dict:
    if not src.is_file():
        raise StageError(f"{src} does not exist; run prepare_data first (snakemake prepare_data)")
    start = time.perf_counter()
    size, crc = check_file(src, rerun=RERUN_PREPARE)
    if dst.is_file() and dst.stat().st_size == size and file_crc(dst) == (size, crc):
        write_record(dst, size, crc)
        log.info("Kept the identical copy at %s (%d bytes, CRC-32C %#010x)", dst, size, crc)
        return {"bytes": size, "crc32c": crc, "copied": False}
    with recorded(dst, expect=(size, crc)) as tmp, open(src, "rb") as fin, open(tmp, "wb") as fout:
        shutil.copyfileobj(fin, fout, length=8 << 20)
    seconds = time.perf_counter() - start
    log.info("Staged %s -> %s (%.1f MB, CRC-32C %#010x verified) in %.2f s", src, dst, size / 1e6, crc, seconds)
    return {"bytes": size, "crc32c": crc, "copied": True}


def run(cfg: TrainflowConfig) -> dict:
    return stage_file(Path(cfg.io.tokens), Path(cfg.io.staged_tokens))


@hydra.main(version_base="1.3", config_path=str(CONF_DIR), config_name="stage_data")
def main(raw: DictConfig) -> None:
    run_stage(raw, run)


if __name__ == "__main__":
    main()
