"""Stage the token shards from the capacity tier to the fast tier, in parallel streams, verified by CRC.

    python -m trainflow.stages.stage_data io.tokens=/capstor/.../index.json io.staged_tokens=/iopsstor/.../index.json

A shard already on the fast tier with the size and CRC-32C of the index is kept (a rerun after a kill
resumes where the copies stopped); the rest must fit in the free space there, checked before anything is
copied. Each copy is written under a temporary name, fsynced, re-read and checked against the index, and
only then renamed into place with its record (data.record): a damaged capacity-tier shard is never staged,
and a copy that reads back wrong from a sound source is made once more, then fails.
The staged index is written last: training reads it, so a half-staged corpus has none.
"""

from __future__ import annotations

import shutil
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from trainflow.config import TrainflowConfig
from trainflow.crc import file_crc
from trainflow.data.index import Shard, read_index, write_index_file
from trainflow.data.record import DataError, read_record, record_path, recorded, write_record
from trainflow.energy.metrics import StageFigures
from trainflow.stage import StageError, stage_log, stage_main

log = stage_log(__file__)
RERUN_PREPARE = "prepare_data (snakemake --forcerun prepare_data)"


def is_staged(shard: Shard, dst: Path) -> bool:
    """`dst` holds exactly `shard` (its size, then its CRC, which re-reads it); its record is rewritten if lost."""
    if not dst.is_file() or dst.stat().st_size != shard.bytes or file_crc(dst) != (shard.bytes, shard.crc32c):
        return False
    write_record(dst, shard.bytes, shard.crc32c)
    return True


def stage_shard(shard: Shard, dst: Path) -> bool:
    """Stage one shard; False where an identical copy was kept."""
    if not shard.path.is_file():
        raise StageError(f"{shard.path} does not exist; run prepare_data first (snakemake prepare_data)")
    want = (shard.bytes, shard.crc32c)
    if read_record(shard.path, rerun=RERUN_PREPARE) != want:
        raise StageError(f"{shard.path} was rewritten after its index was; rerun {RERUN_PREPARE}")
    if is_staged(shard, dst):
        return False
    try:
        copy_recorded(shard.path, dst, want)
    except DataError as err:  # the copy read back wrong: the source's fault, or the copy's (then once more)
        if file_crc(shard.path) != want:
            raise StageError(
                f"{shard.path} no longer matches the size and CRC-32C of its index; it is damaged: rerun "
                f"{RERUN_PREPARE}"
            ) from err
        log.warning("Recopying %s: the first copy read back wrong (%s)", dst, err)
        try:
            copy_recorded(shard.path, dst, want)
        except DataError as again:
            raise StageError(f"{dst} read back wrong after two copies ({again})") from again
    return True


def copy_recorded(src: Path, dst: Path, want: tuple[int, int]) -> None:
    """Copy through a temporary name, re-read it against `want` (data.record.recorded), then rename it into
    place with its record. The copy is the kernel's (shutil.copyfile uses sendfile): checking the copy
    against the index checks the source too, in one read instead of two."""
    with recorded(dst, expect=want) as tmp:
        copy_file(src, tmp)


def copy_file(src: Path, dst: Path) -> None:
    shutil.copyfile(src, dst)


def prune(folder: Path, names: set[str]) -> None:
    """Delete what a killed copy left (temporary files) and shards the index no longer lists, with their records:
    their space counts as free."""
    for path in (*folder.glob("shard-*.h5*"), *folder.glob("*.tmp")):
        if path.name.removesuffix(".tmp").removesuffix(".crc.json") not in names or path.suffix == ".tmp":
            path.unlink(missing_ok=True)
            log.info("Deleted %s (left by a killed copy, or no longer in the index)", path)


def free_bytes(folder: Path) -> int:
    """Free space of the file system that holds `folder` (or would, once created)."""
    while not folder.exists():
        folder = folder.parent
    return shutil.disk_usage(folder).free


def stage_shards(src_index: Path, dst_index: Path, *, streams: int) -> StageFigures:
    start = time.perf_counter()
    index = read_index(src_index, rerun=RERUN_PREPARE)
    shards = index.shard_files(src_index.parent)
    for path in (dst_index, record_path(dst_index)):  # training must not read an index whose shards are replaced
        path.unlink(missing_ok=True)
    folder = dst_index.parent
    prune(folder, {s.path.name for s in shards})
    present = [s for s in shards if (folder / s.path.name).is_file()]
    need = sum(s.bytes for s in shards if s not in present or (folder / s.path.name).stat().st_size != s.bytes)
    free = free_bytes(folder)
    if need > free:
        raise StageError(
            f"staging {len(shards)} shards to {folder} needs {need} more bytes but {free} are free; free space on "
            "storage.fast or point storage.fast at a larger file system"
        )
    folder.mkdir(parents=True, exist_ok=True)
    with ThreadPoolExecutor(max_workers=streams) as pool:
        copied = list(pool.map(lambda s: stage_shard(s, folder / s.path.name), shards))
    write_index_file(dst_index, index)
    size, seconds = sum(s.bytes for s in shards), time.perf_counter() - start
    log.info(
        "Staged %d shards (%.1f MB, CRC-32C verified) to %s in %.2f s with %d streams: %d copied, %d identical kept",
        len(shards),
        size / 1e6,
        folder,
        seconds,
        streams,
        sum(copied),
        len(shards) - sum(copied),
    )
    return StageFigures(
        {"shards": len(shards), "bytes": size, "copied": sum(copied), "kept": len(shards) - sum(copied)}
    )


def run(cfg: TrainflowConfig) -> StageFigures:
    return stage_shards(Path(cfg.io.tokens), Path(cfg.io.staged_tokens), streams=cfg.data.stage_streams)


if __name__ == "__main__":
    stage_main(run, config_name="stage_data")
