"""A checkpoint read from storage once per job start, not once per data-parallel replica.

    python -m pytest tests/unit/test_single_read.py

Megatron-Core's "fully parallel load" is the model: the replicas share the reading and exchange the rest over the
network. Here each file of the checkpoint is read whole by one rank, which checks its CRC-32C against the manifest as
it reads and describes its records (checkpoint.tensor_record); a file's bytes then go point to point to the other ranks
whose load plan reads from it (under data parallelism, its dp peers). A rank on another host (or any rank, where the
bytes travel on a GPU: NCCL has its own transports within a node) receives them point to point, each tensor's straight
into its destination where it is that whole tensor (checkpoint.landing), a whole record otherwise, which that rank
reads from memory as checkpoint.reader reads it from a file. A rank on the reader's host maps the memory the reader
read the file into and loads from it as the reader does (checkpoint.host_shared), where gloo would copy every byte
through TCP loopback. Who reads which file is planned once, on DCP's coordinator, from every rank's load plan
(SingleReader.prepare_global_plan): largest files first, each to the rank among those that need it with the fewest
bytes to read so far; a file no rank needs (an empty shard, a reshard that reads fewer keys) is still read and checked
by the least loaded rank. FSDP's shards, which only their own rank needs, are read by that rank alone, as before. The
bytes read are the checkpoint's files once, plus `.metadata`, which every rank reads (DCP plans from it; each rank
checks its CRC). A failed check anywhere raises the same error on every rank before any byte is exchanged or loaded
(the state is untouched), so the caller can fall back to an older checkpoint. The cost: during a load a rank holds the
files it read (its share) and a buffer for each received record that does not land in place. The exchange starts only
once every file is read and checked, as that rule asks (benchmarks/checkpoint_load.py measures what that costs).
"""

from __future__ import annotations

import dataclasses
import io
import os
import time
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

from trainflow.checkpoint.host_shared import Address, SharedBytes, mapped
from trainflow.checkpoint.landing import land
from trainflow.checkpoint.manifest import FALLS_BACK, METADATA, ChecksumError, FileEntry, Manifest
from trainflow.checkpoint.reader import InPlaceReader, not_trainflows, unpickled_metadata
from trainflow.checkpoint.reading import HeldFile, ShortReadError
from trainflow.checkpoint.tensor_record import SavedTensor, describe
from trainflow.crc import BLOCK

CPU = torch.device("cpu")
PHASES = ("read", "agree", "own", "exchange", "received")
"""SingleReader.read_data's phases: this rank's files read and CRC-checked and their records described; every rank's
verdicts, descriptions and shared memory, then asks, gathered (with the wait for the slowest reader); the files this
rank read, and those it maps from a reader on its host, loaded while the exchange runs; the wait for the rest of the
exchange; the received records that did not land in place loaded."""


class Clock:
    """Adds the wall time since the last lap to `seconds[phase]` at each lap."""

    def __init__(self, seconds: dict[str, float]) -> None:
        self.seconds, self.last = seconds, time.perf_counter()

    def lap(self, phase: str) -> None:
        now = time.perf_counter()
        self.seconds[phase] += now - self.last
        self.last = now


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


def read_checked(
    path: Path, want: FileEntry | None, *, directory: Path, into: torch.Tensor | None = None
) -> torch.Tensor:
    """The whole file `path` as a uint8 tensor (`into` where given, of the manifest's size), its size and CRC-32C
    checked against the manifest's `want` as it is read; one CorruptFileError naming the file and the rank that read
    it otherwise."""
    size = path.stat().st_size
    data = torch.empty(size, dtype=torch.uint8) if into is None or into.numel() != size else into
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
    """InPlaceReader whose ranks (of `group`, the default: all) read each file once between them (the module's
    docstring), checking every CRC-32C of `manifest` as they read; `bytes_read` counts this rank's bytes read from
    the checkpoint's files, `bytes_mapped` those of files it copied from the memory of a reader on its host
    (`host_memory`, checkpoint.host_shared), `bytes_received` those that came over the group, `seconds` the wall time
    of each phase of its read_data (PHASES)."""

    def __init__(
        self,
        path: str | os.PathLike,
        *,
        manifest: Manifest,
        thread_count: int,
        device: torch.device = CPU,
        group: dist.ProcessGroup | None = None,
        host_memory: bool = True,
    ):
        super().__init__(path, thread_count=thread_count)
        self.manifest, self.device, self.group, self.host_memory = manifest, device, group, host_memory
        """`device`: where the exchanged bytes travel (NCCL sends device tensors only). `host_memory`: whether ranks
        of one host exchange through memory where the bytes travel on the CPU (else over the group, as across
        hosts)."""
        self.bytes_read = self.bytes_mapped = self.bytes_received = 0
        self.seconds = dict.fromkeys(PHASES, 0.0)

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
        clock = Clock(self.seconds)
        rank, shares = dist.get_rank(self.group), plan.storage_data
        items: dict[str, list[ReadItem]] = {}
        for item in sorted(plan.items, key=self.item_offset):  # the order both ends of an exchange list it in
            items.setdefault(self.storage_data[item.storage_index].relative_path, []).append(item)
        sharing: dict[str, SharedBytes] = {}
        try:
            held, described, addresses = self.read_own(plan, [s for s in shares if s.reader == rank], sharing, clock)
            coming = [s for s in shares if rank in s.receivers]
            near = {s.name: data for s in coming if (data := mapped(addresses.get(s.name))) is not None}
            far = [s for s in coming if s.name not in near]
            landings = {s.name: self.landings(items.get(s.name, []), described[s.name], planner) for s in far}
            self.bytes_mapped += sum(data.numel() for data in near.values())
            self.bytes_received += sum(x.nbytes for ls in landings.values() for x in ls)
            asked = self.gathered({n: [(x.start, x.nbytes) for x in ls if x.nbytes] for n, ls in landings.items()})
        finally:
            for shared in sharing.values():  # every peer that maps a file has it mapped by now
                shared.unshare()
        clock.lap("agree")
        # Every send and receive posted at once, as one batch (NCCL pairs a batch's sends and receives, where ops issued
        # one by one could each wait on the other), so the bytes flow while this rank loads the files it read itself
        # and those a reader on its host shares with it.
        works = dist.batch_isend_irecv(ops) if (ops := self.exchange(shares, held, asked, landings)) else []
        for name, data in (held | near).items():
            self.read_from(HeldFile(self.file_path(name), memoryview(data.numpy())), items.get(name, []), planner)
        clock.lap("own")
        for work in works:
            work.wait()
        clock.lap("exchange")
        for s in far:
            for x in landings[s.name]:
                if x.in_place:
                    planner.commit_tensor(x.item, x.target)
                else:
                    self.read_from(x.held(self.file_path(s.name)), [x.item], planner)
        clock.lap("received")
        done: Future[None] = Future()
        done.set_result(None)
        return done

    def file_path(self, name: str) -> str:
        return str(self.fs.concat_path(self.path, name))

    def landings(self, items: list[ReadItem], described: dict[int, SavedTensor | None], planner: LoadPlanner):
        """Where each of `items`, of a file another rank read, lands on this rank (checkpoint.landing)."""
        infos = [self.storage_data[item.storage_index] for item in items]
        return [
            land(item, info, described[info.offset], planner.resolve_tensor(item).detach(), device=self.device)
            for item, info in zip(items, infos, strict=True)
        ]

    def exchange(self, shares: list[FileShare], held: dict, asked: list[dict], landings: dict) -> list[dist.P2POp]:
        """This rank's sends (of the files it read, the bytes each receiver asked for) and receives (into each
        landing), in the order both ends list them; a pair's messages are told apart by their count (the tag)."""
        rank, ops, count = dist.get_rank(self.group), [], [0] * dist.get_world_size(self.group)

        def op(kind, tensor: torch.Tensor, peer: int) -> dist.P2POp:  # noqa: ANN001 (dist.isend or dist.irecv)
            count[peer] += 1
            return dist.P2POp(kind, tensor, group=self.group, group_peer=peer, tag=count[peer])

        for s in shares:
            if s.reader == rank:
                for peer in s.receivers:
                    for start, n in asked[peer].get(s.name, []):
                        ops.append(op(dist.isend, held[s.name][start : start + n].to(self.device), peer))
            elif rank in s.receivers:
                ops += [op(dist.irecv, x.into, s.reader) for x in landings.get(s.name, []) if x.nbytes]
        return ops

    def gathered(self, mine: object) -> list:
        """`mine` from every rank of the group, by rank (a collective)."""
        everyone: list = [None] * dist.get_world_size(self.group)
        dist.all_gather_object(everyone, mine, group=self.group)
        return everyone

    def read_own(
        self, plan: LoadPlan, mine: list[FileShare], sharing: dict[str, SharedBytes], clock: Clock
    ) -> tuple[dict[str, torch.Tensor], dict, dict[str, Address]]:
        """Read this rank's share of the files, each checked against its CRC, and describe their records; then every
        rank learns whether every rank's checks passed (a collective), and all raise the first failure, before any
        byte is exchanged. This rank's files; every file's records by offset (None: not described); where each file
        that others need and its reader holds in memory its host can share (checkpoint.host_shared) is found. The
        shared memory this rank made goes into `sharing`, by file."""
        held, described, error, addresses = {}, {}, None, {}
        try:
            for item in plan.items:
                if item.type == LoadItemType.BYTE_IO:  # DCP would torch.load it with weights_only=False
                    raise ChecksumError(
                        f"{self._get_metadata_path()} asks to unpickle {item.storage_index.fqn!r} as bytes, which "
                        f"could run code: trainflow saves only tensors; delete {self.path}"
                    )
            folder, files = Path(self.path), self.manifest.files

            def read(s: FileShare) -> torch.Tensor:  # the shared memory is made here, its pages zeroed beside the reads
                return read_checked(folder / s.name, files[s.name], directory=folder, into=self.shareable(s, sharing))

            with ThreadPoolExecutor(max_workers=max(1, min(self.thread_count, len(mine)))) as pool:
                held = dict(zip((s.name for s in mine), pool.map(read, mine), strict=True))
            self.bytes_read += sum(s.bytes for s in mine)
            described = {name: self.described(name, data) for name, data in held.items()}
            addresses = {name: shared.address for name, shared in sharing.items()}
        except (ChecksumError, OSError) as err:
            error = err
        clock.lap("read")
        everyone = self.gathered((error, described, addresses))
        if failed := next((e for e, _, _ in everyone if e is not None), None):
            raise failed
        return (
            held,
            {n: records for _, d, _ in everyone for n, records in d.items()},
            {n: a for _, _, near in everyone for n, a in near.items()},
        )

    def shareable(self, share: FileShare, sharing: dict[str, SharedBytes]) -> torch.Tensor | None:
        """Memory the ranks of this host can map for the file `share`, where others need it and the exchange runs on
        the CPU (put in `sharing`); None where the file is this rank's alone, or the memory cannot be had."""
        if not (share.receivers and self.host_memory and self.device.type == "cpu"):
            return None
        try:
            sharing[share.name] = SharedBytes(share.bytes)
        except OSError:  # no memfd here, or not that much memory: the bytes go over the group
            return None
        return sharing[share.name].tensor

    def described(self, name: str, data: torch.Tensor) -> dict[int, SavedTensor | None]:
        """The records of the file `name`, read whole as `data`, by offset (checkpoint.tensor_record)."""
        path = self.file_path(name)
        f = HeldFile(path, memoryview(data.numpy()))
        infos = [info for info in self.storage_data.values() if info.relative_path == name]
        try:
            return {info.offset: describe(f, info.offset, info.length) for info in infos}
        except Exception as err:  # torch's zip reader on a damaged record: its text would only mislead here
            raise not_trainflows(path, f"{type(err).__name__} reading it") from err

    def read_from(self, f: HeldFile, items: list[ReadItem], planner: LoadPlanner) -> None:
        """Load `items` from `f`, a file's or a record's bytes held in memory, as InPlaceReader reads them from it."""
        try:
            for item in items:
                if not self.read_in_place(f, item, planner):
                    self.read_copied(f, item, planner)
        except (OSError, ChecksumError, ShortReadError):
            raise
        except Exception as err:  # torch's text (weights_only advice, zip internals) would only mislead here
            raise not_trainflows(f.name, f"{type(err).__name__} reading it") from err

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
