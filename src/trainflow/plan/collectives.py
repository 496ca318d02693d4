"""The time of one collective on a group of the mesh: which links it crosses, and ring or tree all-reduce.

    python -c "from trainflow.plan.collectives import Link, allreduce_seconds; \
        print(allreduce_seconds(2**30, 64, Link(gbps=25, latency_us=10), 'ring'))"

The cost model is the textbook alpha-beta one (Hockney; Thakur, Rabenseifner and Gropp 2005, "Optimization
of Collective Communication Operations in MPICH"), per rank, with n ranks, S bytes, B the link bandwidth
per direction and alpha the latency of one hop:

    ring all-reduce   sends 2 (n-1)/n S      time 2 (n-1) alpha + 2 (n-1)/n S / B
    tree all-reduce   sends 2 S              time 2 ceil(log2 n) alpha + 2 S / B

The tree is NCCL's double binary tree (Sanders, Speck and Traeff 2009): each half of the data is reduced
up one tree and broadcast down it, and every rank is an inner node of at most one tree, so it sends S up
and S down. Ring and tree move nearly the same bytes; the tree wins only the latency term, which matters
for small messages on many ranks, not for 100 MB buckets. nccl-tests' busbw is algbw * 2 (n-1)/n for
all-reduce: the ring's bytes, whatever algorithm ran.

Which link: the mesh is (pp, dp, cp, tp), row-major, so a tp group is consecutive ranks, a cp group ranks tp
apart, a dp group ranks cp * tp apart, a pp group ranks dp * cp * tp apart. With R ranks per node, a group whose
members sit g to a node (g = 1 when its stride is R or more) and span N > 1 nodes runs its ring through the g members
of each node and across the network once per node and direction; NCCL gives each of the g NICs a channel, so
the bottleneck bandwidth is min(intra-node, g x network per device) (nccl-tests' multi-node busbw
reaches the node's NIC bandwidth this way). A group inside one node uses the intra-node link.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from trainflow.config.cluster import HardwareConfig
from trainflow.config.layout import ParallelDims
from trainflow.records import Record

ALGORITHMS = ("ring", "tree")


@dataclass(frozen=True)
class Link(Record):
    """The slowest link a group's collective crosses: bandwidth per direction and one hop's latency."""

    gbps: float
    latency_us: float

    def seconds(self, nbytes: float, hops: float = 1) -> float:
        """Time to move nbytes through `hops` latencies at this bandwidth."""
        return hops * self.latency_us * 1e-6 + nbytes / (self.gbps * 1e9)


def group_link(hw: HardwareConfig, *, size: int, stride: int, ranks_per_node: int) -> Link:
    """The link a group of `size` ranks, `stride` apart in rank order, is limited by (module docstring)."""
    per_node = 1 if stride >= ranks_per_node else max(1, min(size, ranks_per_node // stride))
    if size <= per_node:
        return Link(gbps=hw.intra_node_gbps, latency_us=hw.intra_node_latency_us)
    gbps = min(hw.intra_node_gbps, per_node * hw.inter_node_gbps)
    return Link(gbps=gbps, latency_us=hw.inter_node_latency_us)


@dataclass(frozen=True)
class Group(Record):
    """One of the layout's groups: its ranks, the link it is limited by and the all-reduce algorithm it runs
    (cluster.hardware.allreduce_algorithm); its collectives' times are the functions below on these three."""

    size: int
    link: Link
    algorithm: str

    def allreduce_s(self, nbytes: float) -> float:
        return allreduce_seconds(nbytes, self.size, self.link, self.algorithm)

    def bucketed_allreduce_s(self, nbytes: float, *, bucket_bytes: float) -> float:
        return bucketed_allreduce_seconds(nbytes, self.size, self.link, self.algorithm, bucket_bytes=bucket_bytes)

    def shard_s(self, nbytes: float) -> float:
        """A reduce-scatter or all-gather of nbytes in total (shard_seconds)."""
        return shard_seconds(nbytes, self.size, self.link)

    def overlapped_allreduce_s(
        self, nbytes: float, *, bucket_bytes: float, hidden: float | None
    ) -> tuple[float, float]:
        """A bucketed all-reduce in total and exposed: `hidden` seconds of compute beside it (None: no overlap) hide
        all of it but the last bucket, which fills as that compute ends."""
        total = self.bucketed_allreduce_s(nbytes, bucket_bytes=bucket_bytes)
        if hidden is None:
            return total, total
        last_bucket = self.allreduce_s(min(bucket_bytes, nbytes))
        return total, total - min(total - last_bucket, hidden)


@dataclass(frozen=True)
class MeshGroups(Record):
    """Each of the layout's groups, with the link it is limited by."""

    tp: Group
    dp: Group
    """The ranks gradients are averaged over: dp, times cp under context parallel (parallel.mesh's dp_cp)."""
    pp: Group
    cp: Group
    """A context-parallel group, over which every layer all-gathers K and V (size 1 without cp)."""
    shard: Group
    """An FSDP / HSDP shard group (dp_mode=shard; the dp group itself under FSDP), times cp under context parallel."""
    replica: Group
    """HSDP's group of the shards' replicas."""

    def sharded_s(self, *, gradient_bytes: float, weight_bytes: float, gathers: int) -> float:
        """FSDP / HSDP's communication of one rank's state: the reduce-scatter of its gradients and `gathers`
        all-gathers of its weights over the shard group, and HSDP's all-reduce of the shard over the replicas."""
        total = self.shard.shard_s(gradient_bytes) + gathers * self.shard.shard_s(weight_bytes)
        if self.replica.size > 1:
            total += self.replica.allreduce_s(gradient_bytes / self.shard.size)
        return total


def mesh_groups(hw: HardwareConfig, dims: ParallelDims, *, ranks_per_node: int) -> MeshGroups:
    """Every group, its link from its stride in the mesh's (pp, dp, cp, tp) row-major order; dp x cp's shard groups
    are tp apart, their replicas tp x cp x shard apart."""
    shard, cp, tp = dims.shard_size, dims.cp, dims.tp

    def group(size: int, stride: int) -> Group:
        link = group_link(hw, size=size, stride=stride, ranks_per_node=ranks_per_node)
        return Group(size=size, link=link, algorithm=hw.allreduce_algorithm)

    # dp x cp (and a shard group with its cp ranks) is one run of ranks tp apart, as parallel.mesh flattens it.
    return MeshGroups(
        tp=group(tp, 1),
        dp=group(dims.dp * cp, tp),
        pp=group(dims.pp, dims.dp * cp * tp),
        cp=group(cp, tp),
        shard=group(shard * cp, tp),
        replica=group(dims.dp // shard, tp * cp * shard),
    )


def allreduce_bytes(nbytes: float, n: int, algorithm: str) -> float:
    """Bytes one rank sends in an all-reduce of nbytes over n ranks."""
    if n == 1:
        return 0.0
    return 2 * (n - 1) / n * nbytes if algorithm == "ring" else 2.0 * nbytes


def allreduce_seconds(nbytes: float, n: int, link: Link, algorithm: str) -> float:
    """One all-reduce of nbytes over n ranks (module docstring)."""
    if algorithm not in ALGORITHMS:
        raise ValueError(f"all-reduce algorithm {algorithm!r} must be one of {', '.join(ALGORITHMS)}")
    if n == 1:
        return 0.0
    hops = 2 * (n - 1) if algorithm == "ring" else 2 * math.ceil(math.log2(n))
    return link.seconds(allreduce_bytes(nbytes, n, algorithm), hops)


def shard_seconds(nbytes: float, n: int, link: Link) -> float:
    """One reduce-scatter or all-gather (ring) of nbytes in total over n ranks: (n-1)/n of it moves."""
    return 0.0 if n == 1 else link.seconds((n - 1) / n * nbytes, n - 1)


def bucketed_allreduce_seconds(nbytes: float, n: int, link: Link, algorithm: str, *, bucket_bytes: float) -> float:
    """All-reduce of nbytes in buckets of bucket_bytes (the last one partial): a latency term per bucket."""
    full, rest = divmod(nbytes, bucket_bytes)
    return full * allreduce_seconds(bucket_bytes, n, link, algorithm) + (
        allreduce_seconds(rest, n, link, algorithm) if rest else 0.0
    )
