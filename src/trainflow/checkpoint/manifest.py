"""CRC manifests: what a checkpoint directory must contain, byte for byte.

manifest.json = {"algorithm": "crc32c", "world_size": w, "file_count": n,
                 "files": {relative path: {"bytes": n, "crc32c": c}}, ...}.
The checksum is CRC-32C (trainflow.crc).

A manifest is complete or the checkpoint is invalid: the folder holds exactly the files it lists,
`file_count` of them, `.metadata` among them, and every rank 0..world_size-1 has its DCP files
`__{rank}_0.distcp`, `__{rank}_1.distcp`, ... (DCP writes at least one per rank, empty if the rank
holds nothing), so a shard dropped from the list together with its file, or planted beside it, is
caught without unpickling anything.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

from trainflow.atomic import fsync_path, write_text_atomic
from trainflow.crc import file_crc
from trainflow.errors import TrainflowError

MANIFEST = "manifest.json"
# DCP's file names (torch.distributed.checkpoint.filesystem), spelt out so checking a folder needs no torch.
METADATA = ".metadata"
RANK_FILE = re.compile(r"__([0-9]+)_([0-9]+)\.distcp")


class ChecksumError(TrainflowError):
    """A checkpoint that is not what trainflow wrote: a file's bytes, the file list or the contents."""


def folder_files(directory: Path) -> list[str]:
    """Everything under `directory` but folders and the manifest, relative to it: what a manifest must list."""
    names = (str(p.relative_to(directory)) for p in directory.rglob("*") if not p.is_dir())
    return sorted(rel for rel in names if rel != MANIFEST)


def write_manifest(
    directory: Path,
    checksums: dict[str, tuple[int, int]] | None = None,
    *,
    world_size: int | None = None,
    **extra: object,
) -> dict:
    """fsync every file under `directory`, then write and fsync manifest.json.

    `checksums` maps relative paths to (bytes, CRC-32C) computed while the files were written
    (checkpoint.writer), and must name exactly the files present; without it every file is read
    back and checksummed here. A file whose size is not the size checksummed raises ChecksumError.
    `world_size` (the ranks that wrote the folder) defaults to the ranks its DCP file names count,
    for folders not written by CheckpointManager.save."""
    names = folder_files(directory)
    if checksums is not None and (odd := sorted(set(names) ^ set(checksums))):
        raise ChecksumError(
            f"{directory / odd[0]} is {'missing' if odd[0] in checksums else 'present'} though the ranks wrote "
            f"{len(checksums)} files; something else changed {directory} during the save, save again"
        )
    files = {}
    for rel in names:
        path = directory / rel
        size, crc = checksums[rel] if checksums is not None else file_crc(path)
        if size != path.stat().st_size:
            raise ChecksumError(
                f"{path} holds {path.stat().st_size} bytes but {size} were written; the save is incomplete, save again"
            )
        fsync_path(path)
        files[rel] = {"bytes": size, "crc32c": crc}
    if world_size is None:
        world_size = 1 + max((int(m[1]) for rel in names if (m := RANK_FILE.fullmatch(rel))), default=0)
    manifest = {"algorithm": "crc32c", "world_size": world_size, "file_count": len(files), "files": files, **extra}
    write_text_atomic(directory / MANIFEST, json.dumps(manifest, indent=1, sort_keys=True))
    return manifest


def read_manifest(directory: Path) -> dict:
    path = directory / MANIFEST
    if not path.is_file():
        raise ChecksumError(
            f"{path} is missing: the checkpoint was never completed; delete {directory} or let trainflow fall back"
        )
    try:
        manifest = json.loads(path.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError, RecursionError) as err:  # RecursionError: nesting too deep
        raise ChecksumError(f"{path} is not valid JSON ({err}); the checkpoint is damaged, delete {directory}") from err
    files = manifest.get("files") if isinstance(manifest, dict) else None
    whole = isinstance(files, dict) and all(
        isinstance(v, dict) and type(v.get("bytes")) is int and type(v.get("crc32c")) is int for v in files.values()
    )
    if not (
        whole
        and type(manifest.get("world_size")) is int
        and manifest["world_size"] >= 1
        and type(manifest.get("file_count")) is int
    ):
        raise ChecksumError(
            f"{path} lacks an integer world_size >= 1, file_count or files with bytes and crc32c (trainflow before "
            f"complete manifests wrote no world_size); the checkpoint cannot be checked, delete {directory}"
        )
    return manifest


def check_complete(directory: Path, manifest: dict) -> None:
    """The folder holds exactly the files the manifest lists, `file_count` of them, `.metadata` and every
    rank's DCP files among them; raises ChecksumError naming the first gap. Reads no file."""
    path, files, world_size = directory / MANIFEST, manifest["files"], manifest["world_size"]
    fix = f"the checkpoint is incomplete or was altered, delete {directory} (trainflow falls back to the previous one)"
    if len(files) != manifest["file_count"]:
        raise ChecksumError(f"{path} lists {len(files)} files but records file_count {manifest['file_count']}; {fix}")
    shards: dict[int, set[int]] = {}
    for rel in files:
        m = RANK_FILE.fullmatch(rel)
        if rel != METADATA and not (m and int(m[1]) < world_size):
            raise ChecksumError(
                f"{path} lists {rel!r}, which DCP does not write at world_size {world_size} (it writes {METADATA} "
                f"and __<rank>_<i>.distcp for rank < {world_size}); {fix}"
            )
        if m:
            shards.setdefault(int(m[1]), set()).add(int(m[2]))
    # A symbolic link would make the checks and the load read a file outside the checkpoint.
    if missing := sorted(rel for rel in files if not (directory / rel).is_file() or (directory / rel).is_symlink()):
        raise ChecksumError(f"{directory / missing[0]} is listed in {MANIFEST} but missing or no regular file; {fix}")
    if unlisted := sorted(set(folder_files(directory)) - set(files)):
        raise ChecksumError(f"{directory} holds {unlisted[0]!r}, which {MANIFEST} does not list; {fix}")
    if METADATA not in files:
        raise ChecksumError(f"{path} does not list {METADATA}; {fix}")
    for rank in range(world_size):
        have = shards.get(rank, set())
        if (gap := min(set(range(max(have, default=0) + 1)) - have, default=None)) is not None:
            raise ChecksumError(
                f"{path} lists no __{rank}_{gap}.distcp, which rank {rank} of world_size {world_size} writes; {fix}"
            )


def verify(directory: Path) -> dict:
    """Check the manifest is complete (check_complete), then re-read every file it lists; raises
    ChecksumError naming the first problem."""
    manifest = read_manifest(directory)
    check_complete(directory, manifest)
    total = 0
    for rel, want in manifest["files"].items():
        path = directory / rel
        size, crc = file_crc(path)
        if (size, crc) != (want["bytes"], want["crc32c"]):
            raise ChecksumError(
                f"{path}: {size} bytes with CRC-32C {crc:#010x}, manifest says {want['bytes']} bytes with "
                f"{want['crc32c']:#010x}; the file is corrupt, load the previous checkpoint"
            )
        total += size
    return {"files": len(manifest["files"]), "bytes": total, "world_size": manifest["world_size"]}
