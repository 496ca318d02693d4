"""A checkpoint read from storage once per job start, not once per data-parallel replica.

    python -m pytest tests/unit/test_single_read.py

Megatron-Core's "fully parallel load" is the model: the replicas share the reading and exchange the rest over the
network. Here each file of the checkpoint is read whole by one rank, which checks its CRC-32C against the manifest as
it reads and describes its records (checkpoint.tensor_record). Who reads which file is planned once, on DCP's
coordinator, from every rank's load plan (checkpoint.load_plan: largest files first, each to the needing rank with the
fewest bytes so far; a file no rank needs is still read and checked), and each rank's plan carries only its own
shares: what it reads and for whom, what it has from whom. A rank on the reader's host maps the memory the reader read
the file into and loads from it as the reader does (checkpoint.host_shared), where gloo would copy every byte through
TCP loopback. The other ranks that need the file (those on other hosts, or all of them where the bytes travel on a GPU)
have its bytes sent by the reader, point-to-point, in phases in which disjoint pairs of ranks exchange at once and
rounds of bounded memory (checkpoint.exchange_rounds), each tensor's straight into its destination where it is that
whole tensor (checkpoint.landing), a whole record otherwise, which that rank reads from memory as checkpoint.reader
reads it from a file. FSDP's shards, which only their own rank needs, are read by that rank alone. The bytes read are
the checkpoint's files once, plus `.metadata`, which every rank reads (DCP plans from it; each rank checks its CRC). A
failed check anywhere raises the same error on every rank before any byte is exchanged or loaded (the state is
untouched), so the caller can fall back to an older checkpoint: the verdict is one number reduced over the group; what
else the ranks agree on (each file's records and shared memory, the ranges asked of it, its pieces) passes only between
its reader and the ranks that need it (checkpoint.agreement), so a rank's messages, like its plan, follow its own
shares, not the world's size. The cost: during a load a rank holds the files it read (its share) and one round of the
exchange. LoadTally counts what each rank read, mapped, sent and received (benchmarks/checkpoint_load.py holds them
against each rank's ideal share).
"""

from __future__ import annotations

import dataclasses
import io
import os
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

import torch
import torch.distributed as dist
from torch.distributed._shard._utils import narrow_tensor_by_index
from torch.distributed.checkpoint.metadata import Metadata
from torch.distributed.checkpoint.planner import LoadItemType, LoadPlan, LoadPlanner, ReadItem
from torch.futures import Future

from trainflow.checkpoint.agreement import Described, asks_to, described_to, exchanged, pieces_to, raise_first_failure
from trainflow.checkpoint.checked_read import read_checked
from trainflow.checkpoint.exchange_rounds import ROUND_BYTES, Piece, RoundExchange
from trainflow.checkpoint.host_shared import Address, SharedBytes, mapped
from trainflow.checkpoint.landing import Landing, land
from trainflow.checkpoint.load_plan import FileShare, rank_plans
from trainflow.checkpoint.manifest import FALLS_BACK, METADATA, ChecksumError, Manifest
from trainflow.checkpoint.reader import InPlaceReader, not_trainflows, unpickled_metadata
from trainflow.checkpoint.reading import HeldFile, ShortReadError
from trainflow.checkpoint.tensor_record import SavedTensor, describe

CPU = torch.device("cpu")
PHASES = ("read", "agree", "own", "exchange")
"""SingleReader.read_data's phases: this rank's files read and CRC-checked and their records described; the agreement
(checkpoint.agreement: every rank's verdict, then the records, shared memory, asks and pieces of this rank's files and
of those it needs, with the wait for the slowest reader); the files this rank read, and those it maps from a reader on
its host, loaded; the exchange's phases, each loading what it brought."""


@dataclass
class LoadTally:
    """What one rank's load moved (SingleReader.tally): bytes read from the checkpoint's files, copied from the memory
    of a reader on its host (`mapped`), sent to the ranks that need the files it read (`sent`, each byte once per
    receiver), received from the ranks that read the others; the exchange's rounds and phases and its peak of extra
    memory; the wall time of each phase of read_data (PHASES)."""

    bytes_read: int = 0
    bytes_mapped: int = 0
    bytes_sent: int = 0
    bytes_received: int = 0
    rounds: int = 0
    phases: int = 0
    peak_exchange_bytes: int = 0
    seconds: dict[str, float] = field(default_factory=lambda: dict.fromkeys(PHASES, 0.0))


class Clock:
    """Adds the wall time since the last lap to `seconds[phase]` at each lap."""

    def __init__(self, seconds: dict[str, float]) -> None:
        self.seconds, self.last = seconds, time.perf_counter()

    def lap(self, phase: str) -> None:
        now = time.perf_counter()
        self.seconds[phase] += now - self.last
        self.last = now


class SingleReader(InPlaceReader):
    """InPlaceReader whose ranks (of `group`, the default: all) read each file once between them (the module's
    docstring), checking every CRC-32C of `manifest` as they read; `tally` counts what this rank moved (LoadTally)."""

    def __init__(
        self,
        path: str | os.PathLike,
        *,
        manifest: Manifest,
        thread_count: int,
        device: torch.device = CPU,
        group: dist.ProcessGroup | None = None,
        host_memory: bool = True,
        round_bytes: int = ROUND_BYTES,
    ):
        super().__init__(path, thread_count=thread_count)
        self.manifest, self.device, self.group, self.host_memory = manifest, device, group, host_memory
        """`device`: where the exchanged bytes and the agreement's messages travel (NCCL sends device tensors only).
        `host_memory`: whether ranks of one host exchange through memory where the bytes travel on the CPU (else over
        the group, as across hosts). `round_bytes`: the exchange's extra memory a round (checkpoint.exchange_rounds)."""
        self.round_bytes = round_bytes
        self.tally = LoadTally()

    def _checked_metadata(self) -> Metadata:
        path = Path(self._get_metadata_path())
        data = read_checked(path, self.manifest.files.get(METADATA), directory=Path(self.path))
        self.tally.bytes_read += data.numel()
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
        mine = rank_plans(files, needs, len(plans))
        return [dataclasses.replace(plan, storage_data=shares) for plan, shares in zip(plans, mine, strict=True)]

    def read_data(self, plan: LoadPlan, planner: LoadPlanner) -> Future[None]:
        clock = Clock(self.tally.seconds)
        shares = plan.storage_data  # a RankShares: prepare_global_plan's
        items: dict[str, list[ReadItem]] = {}
        for item in sorted(plan.items, key=self.item_offset):  # the order both ends of an exchange list it in
            items.setdefault(self.storage_data[item.storage_index].relative_path, []).append(item)
        sharing: dict[str, SharedBytes] = {}
        try:
            held, described, addresses = self.read_own(plan, list(shares.reads), sharing, clock)
            heard = self.exchanged(described_to(shares.reads, described, addresses), shares.readers())
            about: dict[str, Described] = {name: d for by_file in heard.values() for name, d in by_file.items()}
            near = {x.name: data for x in shares.incoming if (data := mapped(about[x.name].address)) is not None}
            far = [x.name for x in shares.incoming if x.name not in near]
            landings = {n: self.landings(items.get(n, []), about[n].records, planner) for n in far}
            self.tally.bytes_mapped += sum(data.numel() for data in near.values())
            asks = {n: [(x.start, x.nbytes) for x in ls if x.nbytes] for n, ls in landings.items()}
            asked = self.exchanged(asks_to(shares.incoming, asks), shares.receivers())
        finally:
            for shared in sharing.values():  # every peer that maps a file mapped it before it asked the reader
                shared.unshare()
        sending, told = pieces_to(shares.reads, asked, self.round_bytes)
        theirs = self.exchanged(told, shares.readers())
        clock.lap("agree")
        for name, data in (held | near).items():
            self.read_from(HeldFile(self.file_path(name), memoryview(data.numpy())), items.get(name, []), planner)
        clock.lap("own")
        self.sent_and_received(held, landings, sending + [p for ps in theirs.values() for p in ps], planner)
        for name, ls in landings.items():  # small records: their bytes came with their description
            for x in ls:
                if not x.nbytes:
                    self.loaded(name, x, planner)
        clock.lap("exchange")
        done: Future[None] = Future()
        done.set_result(None)
        return done

    def exchanged(self, outgoing: dict[int, object], sources: list[int]) -> dict[int, object]:
        """The agreement's messages to the ranks of `outgoing`, and from `sources` (checkpoint.agreement)."""
        return exchanged(outgoing, sources, group=self.group, device=self.device)

    def sent_and_received(
        self, held: dict, landings: dict[str, list[Landing]], mine: list[Piece], planner: LoadPlanner
    ) -> None:
        """Send the files this rank read to those that asked, receive the rest (checkpoint.exchange_rounds)."""
        exchange = RoundExchange(
            dist.get_rank(self.group),
            dist.get_world_size(self.group),
            device=self.device,
            group=self.group,
            loaded=lambda name, x: self.loaded(name, x, planner),
        )
        exchange.run(held, landings, mine)
        t = exchange.tally
        self.tally.bytes_sent += t.bytes_sent
        self.tally.bytes_received += t.bytes_received
        self.tally.rounds += t.rounds
        self.tally.phases += t.phases
        self.tally.peak_exchange_bytes = max(self.tally.peak_exchange_bytes, t.peak_bytes)

    def loaded(self, name: str, x: Landing, planner: LoadPlanner) -> None:
        """Load the landing `x` of the file `name` once its bytes are here."""
        if x.in_place:
            planner.commit_tensor(x.item, x.target)
        else:
            self.read_from(x.held(self.file_path(name)), [x.item], planner)

    def file_path(self, name: str) -> str:
        return str(self.fs.concat_path(self.path, name))

    def landings(self, items: list[ReadItem], described: dict[int, SavedTensor | None], planner: LoadPlanner):
        """Where each of `items`, of a file another rank read, lands on this rank (checkpoint.landing)."""
        infos = [self.storage_data[item.storage_index] for item in items]
        return [
            land(item, info, described[info.offset], planner.resolve_tensor(item).detach(), device=self.device)
            for item, info in zip(items, infos, strict=True)
        ]

    def read_own(
        self, plan: LoadPlan, mine: list[FileShare], sharing: dict[str, SharedBytes], clock: Clock
    ) -> tuple[dict[str, torch.Tensor], dict[str, dict], dict[str, Address]]:
        """Read this rank's share of the files, each checked against its CRC, and describe their records; then every
        rank learns whether every rank's checks passed (a collective), and all raise the lowest failing rank's error,
        before any byte is exchanged (checkpoint.agreement). This rank's files; their records by offset (None: not
        described); the address of those others need that its host can share (checkpoint.host_shared), whose shared
        memory goes into `sharing`, by file."""
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
            self.tally.bytes_read += sum(s.bytes for s in mine)
            described = {name: self.described(name, data) for name, data in held.items()}
            addresses = {name: shared.address for name, shared in sharing.items()}
        except (ChecksumError, OSError) as err:
            error = err
        clock.lap("read")
        raise_first_failure(error, group=self.group, device=self.device)
        return held, described, addresses

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
