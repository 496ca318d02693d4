"""A checkpoint read from storage once per job start, not once per data-parallel replica.

    python -m pytest tests/unit/test_single_read.py

Megatron-Core's "fully parallel load" is the model: the replicas share the reading and exchange the rest over the
network. Here each file of the checkpoint is read whole by one rank, which checks its CRC-32C against the manifest as
it reads, and sends its bytes to the other ranks whose load plan reads from it (point-to-point sends: under data
parallelism those are the file's dp peers); every rank then reads what it needs from memory as checkpoint.reader reads
it from a file (in place where it can, else torch.load with weights_only=True). Who reads which file is planned once,
on DCP's coordinator, from every rank's load plan (SingleReader.prepare_global_plan): largest files first, each to the
rank among those that need it with the fewest bytes to read so far; a file no rank needs (an empty shard, a reshard
that reads fewer keys) is still read and checked by the least loaded rank. FSDP's shards, which only their own rank
needs, are read by that rank alone, as before. The bytes read are the checkpoint's files once, plus `.metadata`, which
every rank reads (DCP plans from it; each rank checks its CRC). A failed check anywhere raises the same error on every
rank before any byte is exchanged or loaded, so the caller can fall back to an older checkpoint. The cost: during a
load a rank holds the bytes of every file its state reads from (its own share and those it receives), one more copy
of its state in host memory, since the sends and receives go out as one batch.
"""

from __future__ import annotations

import dataclasses
import io
import os
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import crc32c
import torch
import torch.distributed as dist
from torch.distributed._shard._utils import narrow_tensor_by_index
from torch.distributed.checkpoint.metadata import Metadata
from torch.distributed.checkpoint.planner import LoadItemType, LoadPlan, LoadPlanner, ReadItem
from torch.futures import Future

from trainflow.checkpoint.manifest import FALLS_BACK, METADATA, ChecksumError, FileEntry, Manifest
from trainflow.checkpoint.reader import InPlaceReader, not_trainflows, unpickled_metadata
from trainflow.checkpoint.reading import HeldFile, ShortReadError
from trainflow.crc import BLOCK

CPU = torch.device("cpu")


class CorruptFileError(ChecksumError):
    """A checkpoint file whose size or CRC-32C is not its manifest's: the load falls back to an older checkpoint."""


@dataclass(frozen=True)
class FileShare:
    """One file of the checkpoint in the load's schedule: the rank that reads it and the ranks it sends it to."""

    name: str
    """Its path relative to the checkpoint folder."""
    bytes: int
    reader: int
    receivers: tuple[int, ...]


def read_checked(path: Path, want: FileEntry | None, *, directory: Path) -> torch.Tensor:
    """The whole file `path` as a uint8 tensor, its size and CRC-32C checked against the manifest's `want` as it is
    read; one CorruptFileError naming the file and the rank that read it otherwise."""
    size = path.stat().st_size
    data = torch.empty(size, dtype=torch.uint8)
    view, crc, done = memoryview(data.numpy()), 0, 0
    with open(path, "rb", buffering=0) as f:
        os.posix_fadvise(f.fileno(), 0, 0, os.POSIX_FADV_SEQUENTIAL)
        while done < size and (n := f.readinto(view[done : done + BLOCK])):
            crc, done = crc32c.crc32c(view[done : done + n], crc), done + n
    if want is None or (done, crc) != (want.bytes, want.crc32c):
        said = f"{want.bytes} bytes with {want.crc32c:#010x}" if want else "nothing (it is not listed)"
        raise CorruptFileError(
            f"{path} (read by rank {dist.get_rank()}): {done} bytes with CRC-32C {crc:#010x}, manifest says {said}; "
            f"the file is corrupt, delete "
            f"{directory} ({FALLS_BACK})"
        )
    return data


def schedule(files: dict[str, int], needs: dict[str, set[int]], ranks: int) -> list[FileShare]:
    """Who reads each of `files` (relative path -> bytes), given the ranks whose plans read from each (`needs`):
    largest first, to the needing rank with the fewest bytes so far (any rank where none needs it)."""
    load = [0] * ranks
    shares = []
    for name in sorted(files, key=lambda n: (-files[n], n)):
        who = sorted(needs.get(name, ())) or range(ranks)
        reader = min(who, key=lambda r: (load[r], r))
        load[reader] += files[name]
        shares.append(FileShare(name, files[name], reader, tuple(r for r in who if r != reader and name in needs)))
    return shares


class SingleReader(InPlaceReader):
    """InPlaceReader whose ranks read each file once between them (the module's docstring), checking every CRC-32C
    of `manifest` as they read; `bytes_read` counts this rank's bytes read from the checkpoint's files."""

    def __init__(self, path: str | os.PathLike, *, manifest: Manifest, thread_count: int, device: torch.device = CPU):
        super().__init__(path, thread_count=thread_count)
        self.manifest, self.device = manifest, device
        """`device`: where the exchanged bytes travel (NCCL sends device tensors only)."""
        self.bytes_read = 0

    def _checked_metadata(self) -> Metadata:
        path = Path(self._get_metadata_path())
        data = read_checked(path, self.manifest.files.get(METADATA), directory=Path(self.path))
        self.bytes_read += data.numel()
        return unpickled_metadata(HeldFile(str(path), memoryview(data.numpy())), path)

    def prepare_global_plan(self, plans: list[LoadPlan]) -> list[LoadPlan]:
        needs: dict[str, set[int]] = {}
        for rank, plan in enumerate(plans):
            for item in plan.items:
                needs.setdefault(self.storage_data[item.storage_index].relative_path, set()).add(rank)
        files = {name: entry.bytes for name, entry in self.manifest.files.items() if name != METADATA}
        if unlisted := sorted(set(needs) - set(files)):
            raise ChecksumError(
                f"{self._get_metadata_path()} places tensors in {unlisted[0]!r}, which the manifest does not list; "
                f"the checkpoint was altered, delete {self.path} ({FALLS_BACK})"
            )
        shares = schedule(files, needs, len(plans))
        return [dataclasses.replace(plan, storage_data=shares) for plan in plans]

    def read_data(self, plan: LoadPlan, planner: LoadPlanner) -> Future[None]:
        rank, shares = dist.get_rank(), plan.storage_data
        held = self.read_own(plan, [s for s in shares if s.reader == rank])
        items: dict[str, list[ReadItem]] = {}
        for item in plan.items:
            items.setdefault(self.storage_data[item.storage_index].relative_path, []).append(item)
        # Every send and receive posted at once, as one batch (NCCL pairs a batch's sends and receives, where ops issued
        # one by one could each wait on the other), so the bytes flow while this rank loads the files it read itself.
        ops, coming = [], []
        for i, s in enumerate(shares):
            if s.reader == rank and s.bytes and s.receivers:
                data = held[s.name].to(self.device)  # one copy on the device per file, sent to each receiver
                ops += [dist.P2POp(dist.isend, data, r, tag=i) for r in s.receivers]
            elif rank in s.receivers:
                coming.append((s, torch.empty(s.bytes, dtype=torch.uint8, device=self.device)))
                ops += [dist.P2POp(dist.irecv, coming[-1][1], s.reader, tag=i)] if s.bytes else []
        works = dist.batch_isend_irecv(ops) if ops else []
        for name, data in held.items():
            self.read_held(name, data, items.get(name, []), planner)
        for work in works:
            work.wait()
        for s, data in coming:
            self.read_held(s.name, data.cpu(), items.get(s.name, []), planner)
        done: Future[None] = Future()
        done.set_result(None)
        return done

    def read_own(self, plan: LoadPlan, mine: list[FileShare]) -> dict[str, torch.Tensor]:
        """Read this rank's share of the files, each checked against its CRC; then every rank learns whether every
        rank's checks passed (a collective), and all raise the first failure, before any byte is exchanged."""
        held, error = {}, None
        try:
            for item in plan.items:
                if item.type == LoadItemType.BYTE_IO:  # DCP would torch.load it with weights_only=False
                    raise ChecksumError(
                        f"{self._get_metadata_path()} asks to unpickle {item.storage_index.fqn!r} as bytes, which "
                        f"could run code: trainflow saves only tensors; delete {self.path}"
                    )
            folder, files = Path(self.path), self.manifest.files
            with ThreadPoolExecutor(max_workers=max(1, min(self.thread_count, len(mine)))) as pool:
                datas = pool.map(lambda s: read_checked(folder / s.name, files[s.name], directory=folder), mine)
                held = dict(zip((s.name for s in mine), datas, strict=True))
            self.bytes_read += sum(s.bytes for s in mine)
        except (ChecksumError, OSError) as err:
            error = err
        errors: list[BaseException | None] = [None] * dist.get_world_size()
        dist.all_gather_object(errors, error)
        if failed := next((e for e in errors if e is not None), None):
            raise failed
        return held

    def read_held(self, name: str, data: torch.Tensor, items: list[ReadItem], planner: LoadPlanner) -> None:
        """Load this rank's `items` of the file `name` from its bytes `data`, as InPlaceReader reads them from it."""
        path = str(self.fs.concat_path(self.path, name))
        f = HeldFile(path, memoryview(data.numpy()))
        try:
            for item in sorted(items, key=self.item_offset):
                if not self.read_in_place(f, item, planner):
                    self.read_copied(f, item, planner)
        except (OSError, ChecksumError, ShortReadError):
            raise
        except Exception as err:  # torch's text (weights_only advice, zip internals) would only mislead here
            raise not_trainflows(path, f"{type(err).__name__} reading it") from err

    def read_copied(self, f: HeldFile, item: ReadItem, planner: LoadPlanner) -> None:
        """DCP's own path for an item read_in_place cannot take (part of a saved chunk, another layout)."""
        info = self.storage_data[item.storage_index]
        f.seek(info.offset)
        saved = torch.load(io.BytesIO(f.read(info.length)), map_location="cpu", weights_only=True)
        tensor = narrow_tensor_by_index(saved, item.storage_offsets, item.lengths)
        target = planner.resolve_tensor(item).detach()
        if target.size() != tensor.size():
            raise not_trainflows(f.name, f"{item.storage_index.fqn!r} holds {tuple(tensor.shape)}, not the plan's")
        target.copy_(tensor)
        planner.commit_tensor(item, target)
