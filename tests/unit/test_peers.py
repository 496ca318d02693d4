"""Recovery from peers' pure parts: which rank serves a replaced one (launch.peers.replica_source), a replacement's
renumbering (launch.rejoin), a replica's state as input (train.peer_state: a hostile header or a flipped byte is
refused in one line, nothing unpickled), the config's refusals (config.rules.recovery_errors)."""

from __future__ import annotations

import json

import pytest
import torch

from trainflow.checkpoint.manifest import GuardState
from trainflow.config import ConfigError, ParallelDims, compose
from trainflow.config.schedule import Schedule
from trainflow.launch.rejoin import renumbered
from trainflow.stream_position import StreamPosition
from trainflow.train.peer_state import Boundary, PeerHeader, PeerStateError, checked, read_header, tensor_crc


def dims(**layout: int) -> ParallelDims:
    cfg = compose("train_segment", [f"parallel.{k}={v}" for k, v in layout.items()])
    return ParallelDims.from_config(cfg.parallel, cfg.model, world_size=cfg.parallel.world_size, global_batch=8)


@pytest.mark.parametrize(
    ("layout", "rank", "lost", "source"),
    [
        (dict(dp=2, tp=1, pp=1), 1, {1}, 0),
        (dict(dp=2, tp=2, pp=1), 2, {2, 3}, 0),  # tp rank 0 of replica 1 <- tp rank 0 of replica 0
        (dict(dp=2, tp=2, pp=1), 3, {2, 3}, 1),
        (dict(dp=4, tp=1, pp=2, microbatches=2), 5, {4, 5}, 6),  # pp stage 1: the lowest live replica of its stage
        (dict(dp=2, tp=1, pp=1), 0, {0, 1}, None),  # both replicas lost
    ],
)
def test_a_replaced_rank_is_served_by_the_live_replica_of_its_shard(layout, rank, lost, source):
    from trainflow.launch.peers import replica_source

    assert replica_source(rank, dims(**layout), lost) == source


def test_under_full_fsdp_no_replica_holds_a_shard_and_under_hsdp_the_other_replica_does():
    from trainflow.launch.peers import replica_source

    assert replica_source(1, dims(dp=2, tp=1, pp=1, dp_mode="shard"), {1}) is None
    # dp4 as 2 replicas x 2 shards: rank 3 (replica 1, shard 1) <- rank 1 (replica 0, shard 1)
    assert replica_source(3, dims(dp=4, tp=1, pp=1, dp_mode="shard", dp_shard=2), {2, 3}) == 1


def test_a_replacement_takes_the_rank_it_replaces():
    slurm = {"SLURM_PROCID": "1", "TRAINFLOW_RANK_BASE": "4", "TRAINFLOW_WORLD": "8"}
    assert renumbered(slurm) == {"SLURM_PROCID": "5", "SLURM_NTASKS": "8"}
    local = {"TRAINFLOW_RANK_BASE": "3", "TRAINFLOW_WORLD": "4"}
    assert renumbered(local) == {"SUBMITIT_LOCAL_GLOBALID": "3", "SUBMITIT_LOCAL_NTASKS": "4"}


def header(tensors: dict[str, torch.Tensor]) -> PeerHeader:
    stream = StreamPosition(block=8, samples=24, sources={"code": 24}, skipped=[])
    schedule = Schedule.of(compose("train_segment", []).optim, horizon=10)
    boundary = Boundary(3, stream, schedule, GuardState(losses=[2.5, 2.4]))
    return PeerHeader(boundary, {k: [t.nbytes, tensor_crc(t)] for k, t in tensors.items()})


MINE = {"model/w": torch.arange(6, dtype=torch.float32), "optim/state.w.exp_avg": torch.ones(6)}


def test_a_replica_s_header_reads_back_and_its_tensors_pass_their_crc():
    sent = header(MINE)
    got = read_header(json.dumps(sent.to_json()).encode(), MINE, source=0)
    assert got == sent
    assert checked("model/w", MINE["model/w"].clone(), got, source=0).equal(MINE["model/w"])


def test_a_flipped_byte_in_a_received_tensor_is_refused_naming_it():
    sent = header(MINE)
    flipped = MINE["model/w"].clone()
    flipped.view(torch.uint8)[5] ^= 1
    with pytest.raises(PeerStateError, match=r"model/w from rank 0 fails its CRC-32C"):
        checked("model/w", flipped, sent, source=0)


@pytest.mark.parametrize(
    "raw",
    [
        b"\x80\x04K\x01.",  # a pickle: never unpickled, it is no JSON
        b'{"boundary": {"step": "3"}, "tensors": {}}',
        b"[" * 100000,
        b'{"boundary": null, "tensors": {"model/w": [24, 1]}, "__class__": "os.system"}',
    ],
)
def test_a_header_that_is_no_state_is_refused_in_one_line(raw):
    with pytest.raises(PeerStateError, match=r"^rank 1's state header does not read") as err:
        read_header(raw, MINE, source=1)
    assert "\n" not in str(err.value)


def test_a_header_of_another_layout_is_refused():
    other = header({"model/w": torch.zeros(3)})
    with pytest.raises(PeerStateError, match=r"rank 1 holds another layout's state"):
        read_header(json.dumps(other.to_json()).encode(), MINE, source=1)


@pytest.mark.parametrize(
    ("overrides", "says"),
    [
        (["resilience.recovery=peers", "parallel=dp2"], r"cluster.allocation.spare_nodes is 0"),
        (["resilience.recovery=peers", "cluster.allocation.spare_nodes=1", "parallel=tp2"], r"holds 1 copy"),
        (
            ["resilience.recovery=peers", "cluster.allocation.spare_nodes=1", "parallel=dp2_shard"],
            r"holds 1 copy of each shard \(dp\(2\), dp_mode=shard",
        ),
    ],
)
def test_recovery_from_peers_without_a_spare_or_a_replica_is_refused(overrides, says):
    with pytest.raises(ConfigError, match=says):
        compose("train_segment", overrides)


def test_snapshots_a_host_cannot_hold_are_refused_at_start_up_in_one_line(one_rank_group):
    from trainflow.checkpoint.staging import StagingError
    from trainflow.train.snapshots import PeerSnapshots

    snapshots = PeerSnapshots(every=2, rank=0, world=2, per_node=1)
    snapshots.check_memory(1000)  # a kilobyte a copy fits
    with pytest.raises(StagingError, match=r"^checkpoint.snapshot_steps=2 keeps up to 6 copies .*: 1 ranks x") as err:
        snapshots.check_memory(10**16)  # 10 PB a copy does not
    assert str(err.value).endswith(
        "set checkpoint.snapshot_steps=0, or give the job more host memory or fewer ranks per node"
    )


def test_under_peers_the_file_system_interval_plans_for_the_job_path_s_failures_only():
    from trainflow.checkpoint.interval import NO_HANGS, file_system_mtbf_s

    peers = ["resilience.recovery=peers", "cluster.allocation.spare_nodes=1", "parallel=dp2"]
    hours = ["cluster.hardware.mtbf_hours=4", "cluster.hardware.hang_share=0.25"]
    assert file_system_mtbf_s(compose("train_segment", hours)) == 4 * 3600
    assert file_system_mtbf_s(compose("train_segment", [*hours, *peers])) == 4 * 3600 / 0.25  # the hangs alone
    no_hangs = compose("train_segment", [*peers, "cluster.hardware.hang_share=0"])
    assert file_system_mtbf_s(no_hangs) == no_hangs.cluster.hardware.mtbf_hours * 3600 / NO_HANGS
