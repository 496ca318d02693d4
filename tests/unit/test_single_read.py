"""The checkpoint read once per job start (checkpoint.single_read): who reads which file, that a rank's plan holds its
own shares only and a rank's agreement messages follow them (at the seed's 4096 ranks and 8192 files as at 64; the
exchange's pieces and phases: test_exchange_rounds), where a received tensor's bytes land (checkpoint.landing), and on 2
gloo ranks that a load reads each byte of the checkpoint once between them, loads what one rank would (into destinations
of the saved layout and of another dtype) through the host's memory and over gloo alike, holds no more than a round of
the exchange at a time, and that a damaged file is caught by the rank that read it and refused on both in one line."""

from __future__ import annotations

import dataclasses
import io
import json
import pickle
import sys
from pathlib import Path

import pytest
import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
import torch.multiprocessing as mp
from torch.distributed.checkpoint.filesystem import _StorageInfo
from torch.distributed.checkpoint.metadata import MetadataIndex
from torch.distributed.checkpoint.planner import LoadItemType, ReadItem

from tests.support import blank_like, flat, free_port, sample_state
from trainflow.checkpoint import single_read
from trainflow.checkpoint.agreement import asks_to, described_to, pieces_to
from trainflow.checkpoint.exchange_rounds import ROUND_BYTES
from trainflow.checkpoint.host_shared import Address
from trainflow.checkpoint.landing import land
from trainflow.checkpoint.load_plan import RankShares, rank_plans, schedule
from trainflow.checkpoint.manager import CheckpointManager, CorruptFileError, step_dir
from trainflow.checkpoint.manifest import METADATA, read_manifest
from trainflow.checkpoint.reader import ExactLoadPlanner
from trainflow.checkpoint.single_read import SingleReader
from trainflow.checkpoint.tensor_record import SavedTensor, describe


def test_replicated_files_are_read_once_and_shared_out_evenly():
    files = {f"__{r}_{i}.distcp": 100 + 10 * r + i for r in range(4) for i in range(2)}
    shares = schedule(files, {name: {0, 1, 2, 3} for name in files}, 4)
    assert sorted(s.name for s in shares) == sorted(files)  # every file once
    per_rank = [sum(s.bytes for s in shares if s.reader == r) for r in range(4)]
    assert max(per_rank) - min(per_rank) <= max(files.values())
    assert all(set(s.receivers) == {0, 1, 2, 3} - {s.reader} for s in shares)


def test_a_file_only_its_rank_needs_is_read_by_it_and_one_nobody_needs_is_still_read():
    """FSDP's shards stay with their rank; an empty or unneeded file is still read, so its CRC is checked."""
    files = {"__0_0.distcp": 500, "__1_0.distcp": 500, "__1_1.distcp": 0}
    shares = {s.name: s for s in schedule(files, {"__0_0.distcp": {0}, "__1_0.distcp": {1}}, 2)}
    assert (shares["__0_0.distcp"].reader, shares["__1_0.distcp"].reader) == (0, 1)
    assert all(s.receivers == () for s in shares.values()) and "__1_1.distcp" in shares


def seed_plans(ranks: int, dp: int = 8) -> list[RankShares]:
    """Each rank's plan where every rank saved 2 files of ~1 MB, which the `dp` ranks of its dp group read."""
    files = {f"__{r}_{i}.distcp": (1 << 20) + r for r in range(ranks) for i in range(2)}
    needs = {f"__{r}_{i}.distcp": set(range(r - r % dp, r - r % dp + dp)) for r in range(ranks) for i in range(2)}
    return rank_plans(files, needs, ranks)


def test_a_ranks_plan_holds_its_own_shares_whatever_the_world_size():
    """The whole schedule in every plan was 1.9 MB a plan at the seed's 4096 ranks and 8192 files."""
    small, seed = seed_plans(64), seed_plans(4096)
    size = {n: max(len(pickle.dumps(p)) for p in plans) for n, plans in ((64, small), (4096, seed))}
    assert size[4096] <= 1.25 * size[64] and size[4096] < 2048, size  # longer names only: __4095_1 beside __63_1
    assert sorted(s.name for p in seed for s in p.reads) == sorted(
        f"__{r}_{i}.distcp" for r in range(4096) for i in (0, 1)
    )
    for rank in (0, 4095):  # the rank reads or receives each file of its dp group, from the rank that reads it
        mine = {s.name for s in seed[rank].reads} | {s.name for s in seed[rank].incoming}
        assert mine == {f"__{r}_{i}.distcp" for r in range(rank - rank % 8, rank - rank % 8 + 8) for i in (0, 1)}
        for x in seed[rank].incoming:
            assert [rank in s.receivers for s in seed[x.reader].reads if s.name == x.name] == [True]


def agreement_bytes(plans: list[RankShares], records: int = 2) -> list[int]:
    """The bytes of the agreement's messages each rank sends and receives (pickled, as checkpoint.agreement sends
    them), built by its own functions from `plans`, each file holding `records` records of 256 KB that every receiver
    asks for whole; the verdict is one number reduced over the group whatever its size."""
    size = [0] * len(plans)

    def message(src: int, dst: int, x: object) -> None:
        n = len(pickle.dumps(x))
        size[src], size[dst] = size[src] + n, size[dst] + n

    saved = SavedTensor(torch.float32, (256, 256), (256, 1), 0, 65536, 64, 262144)
    offsets = [i * 262400 for i in range(records)]
    asked: list[dict] = [{} for _ in plans]
    for q, plan in enumerate(plans):
        described = {s.name: dict.fromkeys(offsets, saved) for s in plan.reads}
        addresses = {s.name: Address(4000 + q, 40, "0" * 32, s.bytes) for s in plan.reads}
        for r, x in described_to(plan.reads, described, addresses).items():
            message(q, r, x)
    whole = [(at, 262400) for at in offsets]
    for r, plan in enumerate(plans):
        ranges = {x.name: whole for x in plan.incoming}
        for q, x in asks_to(plan.incoming, ranges).items():
            message(r, q, x)
            asked[q][r] = x
    for q, plan in enumerate(plans):
        for r, x in pieces_to(plan.reads, asked[q], ROUND_BYTES)[1].items():
            message(q, r, x)
    return size


def test_a_ranks_agreement_messages_follow_its_own_shares_whatever_the_world_size():
    """An all_gather_object of every rank's records and asks grew with the world: here each rank's messages go to and
    come from its dp peers only (8 ranks, 16 files), at 64 ranks as at the seed's 4096."""
    size = {n: max(agreement_bytes(seed_plans(n))) for n in (64, 4096)}
    assert size[4096] <= 1.1 * size[64] and size[4096] < 64 << 10, size  # longer names only: __4095_1 beside __63_1


def landing_of(saved: torch.Tensor, target: torch.Tensor):
    record = io.BytesIO()
    torch.save(saved, record)
    info = _StorageInfo("__0_0.distcp", offset=100, length=len(record.getvalue()))
    index = MetadataIndex("w", (0,) * saved.dim())
    item = ReadItem(LoadItemType.TENSOR, index, (0,) * saved.dim(), index, (0,) * saved.dim(), tuple(saved.shape))
    return land(item, info, describe(record, 0, info.length), target, device=torch.device("cpu")), record.getvalue()


def test_a_received_tensor_lands_in_its_destination_else_its_record_in_a_buffer():
    saved, target = torch.randn(64, 64), torch.zeros(64, 64)
    landing, record = landing_of(saved, target)
    assert landing.in_place and landing.into.data_ptr() == target.data_ptr() and landing.nbytes == saved.nbytes
    start = landing.start - 100
    assert record[start : start + landing.nbytes] == saved.numpy().tobytes()  # the tensor's bytes, no more
    landing, _ = landing_of(saved, torch.zeros(64, 64, dtype=torch.float64))  # DCP converts: through torch.load
    assert not landing.in_place and (landing.start, landing.nbytes) == (100, len(record))
    landing, record = landing_of(torch.randn(4), torch.zeros(4))  # small: its bytes came with its description
    held = landing.held("f")  # read at the record's offset in its file, as checkpoint.reader reads the file
    assert landing.nbytes == 0 and held.tell() == 100 and held.read() == record and held.seek(104) == 104
    assert held.read(4) == record[4:8]


def saved(rank: int, world: int, port: int, folder: str, state: dict) -> CheckpointManager:
    """Join the gloo group of `world` ranks and save `state` as step 3 of `folder`."""
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world)
    manager = CheckpointManager(folder, keep=1, pinned=set())
    manager.save(3, state)
    manager.wait()
    return manager


def loaded(manager: CheckpointManager, state: dict) -> dict:
    """Load step 3 into a zeroed copy of `state`: the LoadDone, and whether every tensor came back equal."""
    into = blank_like(state)
    done = manager.load(3, into).to_json()
    return done | {"equal": all(torch.equal(flat(into)[k], v) for k, v in flat(state).items())}


def finished(manager: CheckpointManager, folder: str, rank: int, out: dict) -> None:
    manager.close()
    Path(folder, f"rank{rank}.json").write_text(json.dumps(out))
    dist.destroy_process_group()


def rank_main(rank: int, world: int, port: int, folder: str) -> None:
    state, out = sample_state(), {}
    manager = saved(rank, world, port, folder, state)
    for host_memory in (True, False):  # the ranks share one host: through its memory, else over gloo as across hosts
        manager.host_memory, mode = host_memory, "memory" if host_memory else "group"
        out[mode] = loaded(manager, state)
        wider = blank_like(state)
        wider["model"]["w"] = torch.zeros(64, 32, dtype=torch.float64)  # a record that does not land in place
        manager.load(3, wider)
        out[f"{mode}_wider"] = torch.equal(wider["model"]["w"], state["model"]["w"].double())
    manager.host_memory = True
    dist.barrier()
    if rank == 0:  # the largest shard file, whichever rank's share it is
        victim = max(step_dir(Path(folder), 3).glob("__*.distcp"), key=lambda p: p.stat().st_size)
        data = bytearray(victim.read_bytes())
        data[len(data) // 2] ^= 0xFF
        victim.write_bytes(bytes(data))
    dist.barrier()
    try:
        manager.load(3, blank_like(state))
    except CorruptFileError as err:
        out["error"] = str(err)
    out["newest"] = manager.newest_complete(at_most=10)  # the manifest is complete: only the read finds it
    finished(manager, folder, rank, out)


@pytest.mark.skipif(sys.platform != "linux", reason="gloo over TCP on this host")
def test_two_ranks_read_each_byte_once_and_the_reader_catches_a_damaged_file(tmp_path):
    mp.spawn(rank_main, args=(2, free_port(), str(tmp_path)), nprocs=2)
    outs = [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in range(2)]
    manifest = read_manifest(step_dir(tmp_path, 3))
    metadata = manifest.files[METADATA].bytes
    for out in outs:
        assert out["memory"]["equal"] and out["memory_wider"] and out["group"]["equal"] and out["group_wider"]
        for done in (out["memory"], out["group"]):
            # The shard files once between the two ranks, .metadata once by each (DCP plans from it).
            assert done["bytes_read_all"] == manifest.nbytes + metadata
            assert done["checkpoint_bytes"] == manifest.nbytes
            assert done["bytes_read"] < manifest.nbytes
        assert out["memory"]["bytes_received"] == out["group"]["bytes_mapped"] == 0
    # What a rank needs of the file its peer read it mapped from the peer's memory, or received over gloo.
    assert sum(out["memory"]["bytes_mapped"] for out in outs) > 0
    assert sum(out["group"]["bytes_received"] for out in outs) > 0
    assert outs[0]["error"] == outs[1]["error"] and "\n" not in outs[0]["error"]
    victim = max(step_dir(tmp_path, 3).glob("__*.distcp"), key=lambda p: p.stat().st_size)
    assert outs[0]["error"].startswith(f"{victim} (read by rank ")
    reader = int(outs[0]["error"].split("(read by rank ", 1)[1].split(")")[0])
    assert outs[reader]["memory"]["bytes_read"] >= manifest.files[victim.name].bytes
    assert "manifest says" in outs[0]["error"] and "the file is corrupt" in outs[0]["error"]
    assert outs[0]["newest"] == outs[1]["newest"] == 3


ROUND = 48 << 10
"""A round of 48 KB in the test below: half of it a phase's pieces, one of its 18 KB records (a 64 x 64 float32 tensor
and its zip); each rank receives four."""


def rounds_main(rank: int, world: int, port: int, folder: str) -> None:
    """Over gloo, into destinations of the saved dtype (in place) and of float64 (through each record's buffer)."""
    g = torch.Generator().manual_seed(0)
    state = {"model": {f"w{i}": torch.randn(64, 64, generator=g) for i in range(8)}, "step": torch.tensor(7)}
    manager, out = saved(rank, world, port, folder, state), {}
    for dtype in (torch.float32, torch.float64):
        into = {"model": {k: torch.zeros(64, 64, dtype=dtype) for k in state["model"]}, "step": torch.tensor(0)}
        folder_3 = step_dir(Path(folder), 3)
        reader = SingleReader(
            folder_3, manifest=read_manifest(folder_3), thread_count=2, host_memory=False, round_bytes=ROUND
        )
        dcp.load(into, storage_reader=reader, planner=ExactLoadPlanner())
        equal = all(torch.equal(into["model"][k], v.to(dtype)) for k, v in state["model"].items())
        out[str(dtype)] = dataclasses.asdict(reader.tally) | {"equal": equal}
    finished(manager, folder, rank, out)


@pytest.mark.skipif(sys.platform != "linux", reason="gloo over TCP on this host")
def test_the_exchange_holds_at_most_a_round_and_counts_what_it_moves(tmp_path):
    mp.spawn(rounds_main, args=(2, free_port(), str(tmp_path)), nprocs=2)
    outs = [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in range(2)]
    for kind in ("torch.float32", "torch.float64"):
        assert all(out[kind]["equal"] for out in outs)
        sent, received = [out[kind]["bytes_sent"] for out in outs], [out[kind]["bytes_received"] for out in outs]
        assert sent == received[::-1] and min(sent) > 0  # what one broadcast the other received, no more
    # In place: each tensor's bytes straight into its destination, nothing held beside them.
    assert all(out["torch.float32"]["peak_exchange_bytes"] == 0 for out in outs)
    # Through each record's buffer: at most a round's worth held at once, over several rounds.
    for out in outs:
        assert 0 < out["torch.float64"]["peak_exchange_bytes"] <= ROUND and out["torch.float64"]["rounds"] >= 2
        assert out["torch.float64"]["bytes_received"] > ROUND  # more than a round moved


def mixed_main(rank: int, world: int, port: int, folder: str) -> None:
    """Ranks 0 and 1 share a host; rank 2 stands for one on another host, which can map nothing of theirs."""
    g = torch.Generator().manual_seed(0)
    state = {"model": {f"w{i}": torch.randn(128, 128, generator=g) for i in range(6)}, "step": torch.tensor(7)}
    manager = saved(rank, world, port, folder, state)
    if rank == 2:
        single_read.mapped = lambda address: None
    finished(manager, folder, rank, loaded(manager, state))


@pytest.mark.skipif(sys.platform != "linux", reason="gloo over TCP on this host")
def test_a_load_maps_what_its_host_shares_and_receives_the_rest(tmp_path):
    mp.spawn(mixed_main, args=(3, free_port(), str(tmp_path)), nprocs=3)
    outs = [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in range(3)]
    assert all(out["equal"] for out in outs)
    # The two of one host map each other's files and rank 2's; rank 2 receives both of theirs over gloo.
    assert all(out["bytes_mapped"] > 0 and out["bytes_received"] == 0 for out in outs[:2])
    assert outs[2]["bytes_mapped"] == 0 and outs[2]["bytes_received"] > 0
    assert sum(out["bytes_read"] for out in outs) == outs[0]["bytes_read_all"]
