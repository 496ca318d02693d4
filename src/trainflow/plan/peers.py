"""Recovery from peers (resilience.recovery=peers), planned: what one failure costs when the survivors keep their
processes and state and the failed node's ranks start on a spare node and take theirs from a live data-parallel
replica (launch.peers, train.peer_state), each term with the law or figures it rests on and whether a run at the
campaign's scale measured them (cluster.measured).

    python -m trainflow.plan experiment=llama70b_alps resilience.recovery=peers    # "Recovery from peers"

The terms in the order they end, the recovery's critical path (the survivors wait at the new rendezvous for the
replacement ranks):
- detection: the process-death case. A dead rank's peers find their collective broken at once and report, and the
  supervisor waits at most resilience.failure_detect_s for every rank to report or be seen ended (launch.peer_recovery):
  the plan takes that bound, as configured (at most the collective timeout). A node that vanishes without a TCP reset
  leaves its peers in their collective until cluster.runtime.collective_timeout_s: not modelled (the hangs, which the
  heartbeat finds, take the job path).
- verdict: the supervisor's decision (the start-up's verdict part).
- launch, imports: the replacement ranks' processes on the spare (the start-up's parts).
- rendezvous, communicators: every rank at the fresh rendezvous, the mesh's groups made again (the parts at W ranks).
- build: every rank's model on the new groups, the survivors' state kept in memory (the build part).
- transfer: one rank's fp32 weights and AdamW moments (plan.memory's fullest rank, the bytes an async save stages)
  from a live replica over the receiver's network link (cluster.hardware.inter_node_gbps: one NIC per device).
- crc: train.peer_state checks each tensor's CRC-32C on both sides, the sender's before it sends and the receiver's
  after each tensor it receives: twice the bytes copied to host memory (host_copy_gbps) and checked at crc_gbps.
- warm-up: the first step's law beyond its one step (the failed step itself is redone: lost work).
No load (no checkpoint is read) and no queue (the spare is in the allocation). The lost work is the failed step's part
done before the failure, half a step on average, as training resumes at the failed step; failure to first step adds
the whole redone step. Without start-up parts (cluster.hardware.startup unset) the start is hot_restart_s whole (its
load aside already, one step in it): an upper bound.
"""

from __future__ import annotations

from dataclasses import dataclass

from trainflow.config.cluster import HardwareConfig
from trainflow.config.startup import StartupPart
from trainflow.plan.collectives import Link
from trainflow.plan.failures import PeersPath
from trainflow.plan.startup import StartupPlan, law_terms
from trainflow.records import Record

GB = 1e9
DETECTION = "detection"
PARTS = (
    StartupPart.VERDICT,
    StartupPart.LAUNCH,
    StartupPart.IMPORTS,
    StartupPart.RENDEZVOUS,
    StartupPart.COMMUNICATORS,
    StartupPart.BUILD,
)
"""The start-up's parts a recovery from peers runs: all but the load and the first step (its warm-up is a term)."""


@dataclass(frozen=True)
class PeersTerm(Record):
    """One term of a recovery from peers."""

    name: str
    seconds: float
    how: str
    """Its law or figures, as printed ("14.4 GB at inter_node_gbps 25 GB/s")."""
    label: str
    """"measured at scale: <where>" where a run at the campaign's scale measured every input it rests on, else "not
    measured at scale"."""


@dataclass(frozen=True)
class PeersRecovery(Record):
    """One failure's recovery from peers at the campaign's world size: its terms and what it costs the campaign."""

    world: int
    share: float
    """Of all failures: every one but the hangs (1 - cluster.hardware.hang_share), which take the job path."""
    terms: list[PeersTerm]
    step_s: float
    timeout_s: float
    """cluster.runtime.collective_timeout_s: when a node lost without a TCP reset is seen (not modelled)."""
    lost_steps: float = 0.5
    """Steps a failure loses on average: half the failed step, or with peer snapshots and no replica half the
    snapshot interval and the chance of one more (plan.snapshots)."""

    @property
    def recover_s(self) -> float:
        """From the failure to the ranks ready to redo the failed step: the terms' sum."""
        return sum(t.seconds for t in self.terms)

    @property
    def lost_s(self) -> float:
        """Half a step on average, the failed step's part done before the failure; with snapshots and no replica,
        half the snapshot interval and the chance of one more (lost_steps)."""
        return self.lost_steps * self.step_s

    @property
    def first_step_s(self) -> float:
        """From the failure to the first step's end: the recovery and the failed step redone whole."""
        return self.recover_s + self.step_s

    def path(self) -> PeersPath:
        """This recovery as the campaign's failure model takes it (plan.failures)."""
        detect_s = next(t.seconds for t in self.terms if t.name == DETECTION)
        return PeersPath(self.share, detect_s, self.recover_s - detect_s, self.lost_s)


def label(measured: dict[str, str], names: list[str]) -> str:
    """Whether a run at the campaign's scale measured every one of `names` (cluster.measured), and where."""
    if missing := [n for n in names if n not in measured]:
        return "not measured at scale" + (f" ({', '.join(missing)})" if len(names) > 1 else "")
    return "measured at scale: " + "; ".join(dict.fromkeys(measured[n] for n in names))


def plan_peers(
    h: HardwareConfig,
    measured: dict[str, str],
    *,
    detect_s: float,
    timeout_s: float,
    state_bytes: float,
    step_s: float,
    startup: StartupPlan,
) -> PeersRecovery:
    """A recovery from peers on hardware `h` (`measured`: cluster.measured): `detect_s` a dead rank's detection as
    configured, `state_bytes` one rank's weights and optimizer state, `startup` the start-up's parts at the world."""
    detection = PeersTerm(
        DETECTION, detect_s, "resilience.failure_detect_s: a rank's process died", "not measured at scale"
    )
    transfer = PeersTerm(
        "transfer",
        Link(gbps=h.inter_node_gbps, latency_us=h.inter_node_latency_us).seconds(state_bytes),
        f"{state_bytes / GB:.4g} GB of a rank's state at inter_node_gbps {h.inter_node_gbps:g} GB/s",
        label(measured, ["inter_node_gbps"]),
    )
    crc = PeersTerm(
        "crc",
        2 * state_bytes / GB * (1 / h.host_copy_gbps + 1 / h.crc_gbps),
        f"2 x {state_bytes / GB:.4g} GB to host at host_copy_gbps {h.host_copy_gbps:g} GB/s, CRC-32C at crc_gbps "
        f"{h.crc_gbps:g} GB/s",
        label(measured, ["host_copy_gbps", "crc_gbps"]),
    )
    terms = [detection, *start_terms(h, measured, startup, before=[transfer, crc])]
    return PeersRecovery(startup.world, 1 - h.hang_share, terms, step_s=step_s, timeout_s=timeout_s)


def start_terms(
    h: HardwareConfig, measured: dict[str, str], startup: StartupPlan, *, before: list[PeersTerm]
) -> list[PeersTerm]:
    """The start-up's parts a recovery runs (PARTS), then `before` (the state's), then the first step's warm-up; or
    without parts hot_restart_s whole, then `before`."""
    if h.startup is None:
        whole = f"hot_restart_s {startup.hot_restart_s:.3g} s whole: no start-up parts (cluster.hardware.startup)"
        return [PeersTerm("start-up", startup.hot_restart_s, whole, label(measured, ["hot_restart_s"])), *before]
    parts = [
        PeersTerm(p.part.value, p.seconds, p.law, label(measured, [p.part.value]))
        for p in startup.parts
        if p.part in PARTS
    ]
    warm = law_terms(h.startup.law(StartupPart.FIRST_STEP), world=startup.world)
    warm_up = PeersTerm(
        "warm-up",
        sum(s for s, _ in warm),
        " + ".join(text for _, text in warm) + " (first_step beyond its step)",
        label(measured, [StartupPart.FIRST_STEP.value]),
    )
    return [*parts, *before, warm_up]
