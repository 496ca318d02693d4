"""CRC manifests: what a checkpoint directory must contain, byte for byte, and what the run recorded beside it.

manifest.json = {"format": 3, "algorithm": "crc32c", "world_size": w, "file_count": n,
                 "files": {relative path: {"bytes": n, "crc32c": c}},
                 "step": s, "series": ..., "layout": ..., "model": {...}, "guard": {...}, "stream": {...},
                 "schedule": {...}, "settings": {...}, "code": {...}, "init_from": ...} (Manifest).
The checksum is CRC-32C (trainflow.crc). Format 1 (trainflow before formats) kept the data windows a rollback left
out in its guard entry; format 2 keeps the data stream's position instead (data.stream), with the schedule, settings
and code that trained it: a format-1 manifest reads with its windows in `legacy_windows`, and the trainer derives
the position from them and the step (data.stream.migrated). Format 3 adds the schedule's kind, decay_steps and
decay_shape (optim.schedule=wsd): a format-2 schedule reads as the cosine it was.

A manifest is complete or the checkpoint is invalid: the folder holds exactly the files it lists,
`file_count` of them, `.metadata` among them, and every rank 0..world_size-1 has its DCP files
`__{rank}_0.distcp`, `__{rank}_1.distcp`, ... (DCP writes at least one per rank, empty if the rank
holds nothing), so a shard dropped from the list together with its file, or planted beside it, is
caught without unpickling anything. The manifest's CRCs cover the other files, not itself: it is read as
untrusted input, every field checked here (read_manifest), the model only where it is asked for
(Manifest.recorded_model), since a checkpoint whose model this version cannot read still resumes.
"""

from __future__ import annotations

import dataclasses
import json
import math
import re
import reprlib
from dataclasses import dataclass
from pathlib import Path
from typing import get_type_hints

from trainflow.atomic import fsync_path, write_text_atomic
from trainflow.code_version import CodeVersion
from trainflow.config import ModelConfig
from trainflow.config.checks import domain_errors
from trainflow.config.rules import model_errors
from trainflow.config.schedule import Schedule
from trainflow.crc import file_crc
from trainflow.errors import TrainflowError
from trainflow.records import NewerFormatError, Record, RecordError, fields_added, read_json
from trainflow.stream_position import StreamPosition

MANIFEST = "manifest.json"
# DCP's file names (torch.distributed.checkpoint.filesystem), spelt out so checking a folder needs no torch.
METADATA = ".metadata"
RANK_FILE = re.compile(r"__([0-9]+)_([0-9]+)\.distcp")
ALGORITHM = "crc32c"
MODEL_TYPES = get_type_hints(ModelConfig)
"""ModelConfig's field name -> int, float, str or bool: what a manifest's model must hold."""
SCALING = ("rope_scaling", "rope_factor", "rope_low_freq_factor", "rope_high_freq_factor", "rope_original_seq_len")
"""model.rope_scaling and its llama3 parameters, added with model.tie_embeddings (issue 34): a manifest written before
lacks them, and meant what their defaults mean (no scaling, an untied head)."""
ADDED = {f.name: f.default for f in dataclasses.fields(ModelConfig) if f.name in (*SCALING, "tie_embeddings")}


class ChecksumError(TrainflowError):
    """A checkpoint that is not what trainflow wrote: a file's bytes, the file list or the contents."""


@dataclass(frozen=True)
class FileEntry(Record):
    bytes: int
    crc32c: int


@dataclass(frozen=True)
class GuardState(Record):
    """What a checkpoint's manifest keeps of the loss-spike guard (train.guard), its `guard` entry; the data a rollback
    left out is the stream's (data.stream.StreamPosition.skipped)."""

    losses: list[float]
    """The last train.spike.window applied losses, oldest first."""

    def __post_init__(self) -> None:
        if not all(math.isfinite(x) for x in self.losses):
            raise TrainflowError(
                "it holds a non-finite loss, which trainflow never writes; the checkpoint was altered: delete it "
                "(trainflow falls back to the previous one)"
            )


@dataclass(frozen=True)
class Provenance:
    """What the trainer records in every manifest beside the files (CheckpointManager.save's `provenance`)."""

    layout: str | None = None
    """parallel.name of the layout that wrote it."""
    model: ModelConfig | None = None
    """What trainflow.export rebuilds the model from."""
    guard: GuardState | None = None
    """What a resume from it judges and draws with (train.guard)."""
    init_from: str | None = None
    """The Hugging Face folder step 0 came from (io.init_from); None: random weights."""
    series: str | None = None
    """The checkpoint series it belongs to (config.identity.series_name)."""
    stream: StreamPosition | None = None
    """Where the training stream stands after its step (data.stream)."""
    schedule: Schedule | None = None
    """The learning-rate schedule that trained it (config.schedule)."""
    settings: dict[str, object] | None = None
    """The settings it was trained with (config.identity.settings): what the next segment's changes are against."""
    code: CodeVersion | None = None
    """The code that trained it."""


NO_PROVENANCE = Provenance()
"""What a folder not written by the trainer records (tests, benchmarks, an import)."""


def legacy_guard(data: dict) -> dict:
    """Format 1 -> 2: the guard's skipped data windows move out to legacy_windows (the stream's position replaces
    them, derived by the trainer, which knows the batch they were windows of)."""
    guard = data.get("guard")
    if isinstance(guard, dict) and "skipped" in guard:
        guard = dict(guard)
        data = {**data, "guard": guard, "legacy_windows": guard.pop("skipped")}
    return data


@dataclass(frozen=True)
class Manifest(Record):
    """manifest.json. A field that is None is left out of the file (manifests before it held none)."""

    FORMAT = 3
    MIGRATIONS = {1: legacy_guard, 2: fields_added}  # 3: schedule.kind, decay_steps, decay_shape

    algorithm: str
    world_size: int
    """The ranks that wrote the folder."""
    file_count: int
    files: dict[str, FileEntry]
    step: int | None = None
    layout: str | None = None
    model: object = None
    """ModelConfig's fields as written: recorded_model checks them."""
    guard: GuardState | None = None
    init_from: str | None = None
    series: str | None = None
    stream: StreamPosition | None = None
    schedule: Schedule | None = None
    settings: dict[str, object] | None = None
    code: CodeVersion | None = None
    legacy_windows: list[int] | None = None
    """A format-1 manifest's skipped data windows (its guard's); None in format 2."""

    def __post_init__(self) -> None:
        if self.algorithm != ALGORITHM or self.world_size < 1:
            raise TrainflowError(
                f"it records algorithm {self.algorithm!r} and world_size {self.world_size}, where trainflow writes "
                f"{ALGORITHM!r} and world_size >= 1"
            )

    def to_json(self) -> dict:
        return {k: v for k, v in super().to_json().items() if v is not None}

    @property
    def nbytes(self) -> int:
        return sum(f.bytes for f in self.files.values())

    def recorded_model(self, path: Path) -> ModelConfig:
        """The model it records (CheckpointManager.save writes ModelConfig's fields), checked as a config is; one
        RecordError naming `path` (this manifest's file) and the first field missing, unknown, mistyped or out of
        its domain."""
        values = self.model
        if values is None:
            raise RecordError(f"{path} records no model")
        if not isinstance(values, dict):
            raise RecordError(
                f"{path} records the model as {reprlib.repr(values)}, not an object of ModelConfig's fields"
            )
        values = ADDED | values
        if odd := sorted(set(values) ^ set(MODEL_TYPES)):
            why = "lacks ModelConfig's field" if odd[0] in MODEL_TYPES else "holds a field ModelConfig has not,"
            raise RecordError(f"{path}'s model {why} {reprlib.repr(odd[0])}")
        # bool is an int to isinstance; JSON's true is no layer count.
        if wrong := next((k for k, kind in MODEL_TYPES.items() if type(values[k]) is not kind), None):
            kind = MODEL_TYPES[wrong].__name__
            raise RecordError(f"{path} records model.{wrong}({reprlib.repr(values[wrong])}), which is no {kind}")
        m = ModelConfig(**values)
        if errors := domain_errors(m, "model.") or model_errors(m):  # the model rules assume the domains hold
            raise RecordError(f"{path} records a model outside the schema: {'; '.join(errors)}")
        return m


def scaling_mismatch(path: Path, manifest: Manifest, m: ModelConfig) -> str | None:
    """Why the model `m` cannot resume the checkpoint of manifest `path` (None: it can): its rotary scaling or head
    tying differs, which changes what the weights compute, not their shapes."""
    recorded = ADDED | (manifest.model if isinstance(manifest.model, dict) else {})
    scaled = m.rope_scaling != "none" or recorded["rope_scaling"] != "none"
    for name in (*(SCALING if scaled else SCALING[:1]), "tie_embeddings"):
        if getattr(m, name) != recorded[name]:
            return (
                f"model.{name}({getattr(m, name)}) but {path} records {recorded[name]!r}, which its weights were "
                f"trained with; resume with model.{name}={str(recorded[name]).lower()}"
            )
    return None


def folder_files(directory: Path) -> list[str]:
    """Everything under `directory` but folders and the manifest, relative to it: what a manifest must list."""
    names = (str(p.relative_to(directory)) for p in directory.rglob("*") if not p.is_dir())
    return sorted(rel for rel in names if rel != MANIFEST)


def write_manifest(
    directory: Path,
    checksums: dict[str, tuple[int, int]] | None = None,
    *,
    world_size: int | None = None,
    step: int | None = None,
    provenance: Provenance = NO_PROVENANCE,
) -> Manifest:
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
        files[rel] = FileEntry(bytes=size, crc32c=crc)
    if world_size is None:
        world_size = 1 + max((int(m[1]) for rel in names if (m := RANK_FILE.fullmatch(rel))), default=0)
    p = provenance
    manifest = Manifest(
        algorithm=ALGORITHM,
        world_size=world_size,
        file_count=len(files),
        files=files,
        step=step,
        layout=p.layout,
        model=dataclasses.asdict(p.model) if p.model is not None else None,
        guard=p.guard,
        init_from=p.init_from,
        series=p.series,
        stream=p.stream,
        schedule=p.schedule,
        settings=p.settings,
        code=p.code,
    )
    write_text_atomic(directory / MANIFEST, json.dumps(manifest.to_json(), indent=1, sort_keys=True))
    return manifest


FALLS_BACK = "trainflow falls back to the previous one"
"""What a training load does past a checkpoint that fails its checks, which their errors end with; a reader that does
not (the export) gives its own `fallback`."""


def read_manifest(directory: Path, *, fallback: str = FALLS_BACK) -> Manifest:
    """The manifest of `directory`, every field checked (but the model: Manifest.recorded_model); one ChecksumError
    naming the first that is not what trainflow writes."""
    path = directory / MANIFEST
    damaged = f"the checkpoint is damaged, delete {directory} ({fallback})"
    try:
        data = read_json(path, fix=damaged)  # a regular file of JSON, bounded in size and depth
    except FileNotFoundError:
        raise ChecksumError(
            f"{path} is missing: the checkpoint was never completed; delete {directory} ({fallback})"
        ) from None
    except RecordError as err:
        raise ChecksumError(str(err)) from None
    try:
        return Manifest.from_json(data, where=str(path))
    except NewerFormatError:
        raise  # not damage: no fallback to an older checkpoint, whose steps would be trained again
    except RecordError as err:
        raise ChecksumError(
            f"{err}: no manifest trainflow writes (trainflow before complete manifests wrote no world_size); the "
            f"checkpoint cannot be checked, delete {directory} ({fallback})"
        ) from None


def check_complete(directory: Path, manifest: Manifest, *, fallback: str = FALLS_BACK) -> None:
    """The folder holds exactly the files the manifest lists, `file_count` of them, `.metadata` and every
    rank's DCP files among them; raises ChecksumError naming the first gap. Reads no file."""
    path, files, world_size = directory / MANIFEST, manifest.files, manifest.world_size
    fix = f"the checkpoint is incomplete or was altered, delete {directory} ({fallback})"
    if len(files) != manifest.file_count:
        raise ChecksumError(f"{path} lists {len(files)} files but records file_count {manifest.file_count}; {fix}")
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


def verify(directory: Path, *, fallback: str = FALLS_BACK) -> Manifest:
    """Check the manifest is complete (check_complete), then re-read every file it lists; the manifest, or one
    ChecksumError naming the first problem."""
    manifest = read_manifest(directory, fallback=fallback)
    check_complete(directory, manifest, fallback=fallback)
    for rel, want in manifest.files.items():
        path = directory / rel
        size, crc = file_crc(path)
        if (size, crc) != (want.bytes, want.crc32c):
            raise ChecksumError(
                f"{path}: {size} bytes with CRC-32C {crc:#010x}, manifest says {want.bytes} bytes with "
                f"{want.crc32c:#010x}; the file is corrupt, delete {directory} ({fallback})"
            )
    return manifest
