"""Peer snapshots (checkpoint.snapshot_steps > 0, under resilience.recovery=peers), planned: what taking them costs
every step, whether a node's host memory holds them, and the work a failure loses with them (train.snapshots).

    python -m trainflow.plan experiment=llama70b_alps resilience.recovery=peers checkpoint.snapshot_steps=10

Every snapshot_steps steps, at a step's start, each rank copies its state (the fullest rank's weights and AdamW
moments, plan.memory: the bytes of its checkpoint shard) into host memory at cluster.hardware.host_copy_gbps: the step
waits for that copy alone. Then, in a background thread on a gloo group of its own (train.snapshots), it sends the copy
to its partner on the next node and receives its ward's over its network link (inter_node_gbps: one NIC per device,
both directions at once) and checks both copies' CRC-32C at crc_gbps. The background part is hidden while it is
shorter than the snapshot interval (snapshot_steps x step_s); the next snapshot waits for it to end, so where it is
longer the excess blocks too, and the plan says so. The blocking time, paid once per snapshot_steps steps, is overhead
on every step's time, as a checkpoint's blocking is. Not modelled: the background thread's pull on training's network
and CPU while it runs. A rank keeps the newest two completed snapshots, each its own copy and its ward's: four copies
of its state in host memory, six while an exchange runs (the new own copy and the ward's arriving). A node's ranks'
six (the peak) beside what else lives there (an async checkpoint's staging copies; on a CPU device the training
memory) must fit cluster.allocation.mem_gb, else the plan says so in one line (`refused`).

A failure that no live data-parallel replica covers restores from the newest snapshot complete on every rank, every
rank back to its step: a failure strikes uniformly in the interval, so snapshot_steps / 2 steps lost on average, plus
one whole interval more where it strikes while the newest snapshot's exchange still runs (probability background
seconds / interval, at most 1; at most 2 x snapshot_steps then, snapshot_steps otherwise). Without replicas (dp //
shard size < 2) that is every failure the peers path takes; with them, only one that takes both replicas of a shard at
once, which the failure model does not hold (failures are single and memoryless): there the peers path still loses
half a step.
"""

from __future__ import annotations

from dataclasses import dataclass

from trainflow.config.cluster import HardwareConfig
from trainflow.config.schema import TrainflowConfig
from trainflow.plan.campaign import CampaignPlan
from trainflow.plan.peers import GB, PeersTerm, label
from trainflow.plan.setup import PlanSetup
from trainflow.records import Record

BLOCKING = ("host copy",)
"""The terms the step waits for; the rest run in the background."""
COPIES = 6
"""Copies of a rank's state in its host memory at the peak: two kept snapshots (its own and its ward's each), and the
new own copy and the ward's arriving while an exchange runs."""


@dataclass(frozen=True)
class SnapshotPlan(Record):
    """checkpoint.snapshot_steps' blocking terms, its share of the steps' time, its host memory and lost work."""

    steps: int
    """checkpoint.snapshot_steps."""
    step_s: float
    replicas: int
    """Copies of each shard across the data-parallel group (dp // shard size): under 2, snapshots recover every
    failure the peers path takes."""
    terms: list[PeersTerm]
    """One snapshot's parts: the copy to host (blocking), then the exchange and the CRC (in the background)."""
    host_bytes_per_node: float
    """A node's ranks' six copies each at the peak (four kept, six while an exchange runs), beside its other host
    memory (`other_bytes_per_node`)."""
    other_bytes_per_node: float
    """An async checkpoint's staging copies and, on a CPU device, the training memory."""
    host_capacity_bytes: float
    """cluster.allocation.mem_gb."""
    refused: str | None
    """The one line saying the node's host memory cannot hold the snapshots; None when it does."""

    @property
    def copy_s(self) -> float:
        """The copy to host: the step waits for it."""
        return sum(t.seconds for t in self.terms if t.name in BLOCKING)

    @property
    def background_s(self) -> float:
        """The exchange and both copies' CRC, in the background thread."""
        return sum(t.seconds for t in self.terms if t.name not in BLOCKING)

    @property
    def interval_s(self) -> float:
        """The steps' time between two snapshots, which the background part runs beside."""
        return self.steps * self.step_s

    @property
    def waits_s(self) -> float:
        """The background part's excess over the interval: the next snapshot waits for it."""
        return max(0.0, self.background_s - self.interval_s)

    @property
    def blocking_s(self) -> float:
        return self.copy_s + self.waits_s

    @property
    def share(self) -> float:
        """The snapshots' blocking seconds per second of training: one snapshot per snapshot_steps steps."""
        return self.blocking_s / self.interval_s

    @property
    def during_exchange(self) -> float:
        """The chance a failure strikes while the newest snapshot's exchange runs (then the one before it restores)."""
        return min(1.0, self.background_s / self.interval_s)

    @property
    def lost_steps(self) -> float:
        """Steps a peers-path failure loses on average: without replicas half the snapshot interval, plus one
        interval more where it strikes during an exchange; else half the failed step (a failure of both replicas at
        once is not in the model)."""
        return self.steps * (0.5 + self.during_exchange) if self.replicas < 2 else 0.5


def plan_snapshots(
    h: HardwareConfig,
    measured: dict[str, str],
    *,
    steps: int,
    step_s: float,
    replicas: int,
    state_bytes: float,
    ranks_per_node: int,
    other_bytes_per_node: float,
    capacity_bytes: float,
) -> SnapshotPlan:
    """Snapshots every `steps` steps of `step_s` on hardware `h` (`measured`: cluster.measured), `state_bytes` one
    rank's weights and optimizer state, `replicas` the copies of each shard across the data-parallel group."""
    gb = state_bytes / GB
    terms = [
        PeersTerm(
            "host copy",
            gb / h.host_copy_gbps,
            f"{gb:.4g} GB of a rank's state at host_copy_gbps {h.host_copy_gbps:g} GB/s",
            label(measured, ["host_copy_gbps"]),
        ),
        PeersTerm(
            "exchange",
            gb / h.inter_node_gbps,
            f"{gb:.4g} GB to the partner (and the ward's in) at inter_node_gbps {h.inter_node_gbps:g} GB/s, background",
            label(measured, ["inter_node_gbps"]),
        ),
        PeersTerm(
            "crc",
            2 * gb / h.crc_gbps,
            f"2 x {gb:.4g} GB (its own copy and its ward's) CRC-32C at crc_gbps {h.crc_gbps:g} GB/s, background",
            label(measured, ["crc_gbps"]),
        ),
    ]
    per_node = COPIES * state_bytes * ranks_per_node
    refused = None
    if per_node + other_bytes_per_node > capacity_bytes:
        beside = f" beside {other_bytes_per_node / GB:.3g} GB of other host memory" if other_bytes_per_node else ""
        refused = (
            f"checkpoint.snapshot_steps does not fit: {ranks_per_node} ranks per node hold {COPIES} x {gb:.3g} GB each "
            "(4 copies, 6 while an exchange runs), "
            f"{per_node / GB:.3g} GB{beside} of {capacity_bytes / GB:.3g} GB (cluster.allocation.mem_gb); give the job "
            "more host memory, spread the state over more ranks, or set checkpoint.snapshot_steps=0"
        )
    return SnapshotPlan(
        steps=steps,
        step_s=step_s,
        replicas=replicas,
        terms=terms,
        host_bytes_per_node=per_node,
        other_bytes_per_node=other_bytes_per_node,
        host_capacity_bytes=capacity_bytes,
        refused=refused,
    )


def campaign_snapshots(
    cfg: TrainflowConfig, setup: PlanSetup, *, campaign: CampaignPlan, step_s: float
) -> SnapshotPlan | None:
    """cfg's snapshots (None where checkpoint.snapshot_steps is 0): the fullest rank's state, beside the async
    staging copies where the campaign checkpoints asynchronously and the training memory on a CPU device."""
    if not cfg.checkpoint.snapshot_steps:
        return None
    a, ranks = campaign.asynchronous, setup.ranks_per_node
    staged = cfg.checkpoint.mode == "async" and not a.refused
    return plan_snapshots(
        cfg.cluster.hardware,
        cfg.cluster.measured,
        steps=cfg.checkpoint.snapshot_steps,
        step_s=step_s,
        replicas=setup.groups.replica.size,
        state_bytes=a.staging_bytes,
        ranks_per_node=ranks,
        other_bytes_per_node=a.host_bytes_per_node - (0 if staged else ranks * a.staging_bytes),
        capacity_bytes=a.host_capacity_bytes,
    )
