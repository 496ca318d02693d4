"""trainflow.plan.peers and the failure model's two kinds: a recovery from peers' terms from known inputs, each with its
label; the peers path in the expectation against the Monte Carlo, and nothing changed where no failure takes it; the
seed's 70B campaign recovering from peers, as configured and as a what-if, printed term by term; peer snapshots'
blocking terms, host memory and lost work."""

from __future__ import annotations

import dataclasses
import functools

import numpy as np
import pytest

from trainflow.config import compose
from trainflow.config.startup import PartLaw, StartupConfig
from trainflow.errors import ConfigError
from trainflow.plan.__main__ import main
from trainflow.plan.build import build_plan
from trainflow.plan.failures import PeersPath, Timeline, closed_form, expected, failures, simulate
from trainflow.plan.goodput import GoodputPlan
from trainflow.plan.peers import plan_peers
from trainflow.plan.snapshots import plan_snapshots
from trainflow.plan.startup import plan_startup
from trainflow.plan.table import peers_lines, snapshot_lines

SEED = ("experiment=llama70b_alps",)
PEERS = (*SEED, "resilience.recovery=peers")
SNAPSHOTS = (*PEERS, "checkpoint.snapshot_steps=10")
LAWS = StartupConfig(
    fitted="round numbers",
    verdict=PartLaw(1.0),
    launch=PartLaw(2.0),
    imports=PartLaw(3.0),
    rendezvous=PartLaw(0.5, per_rank_s=0.001),
    communicators=PartLaw(0.25, per_doubling_s=0.5),
    build=PartLaw(4.0),
    load=PartLaw(100.0),
    first_step=PartLaw(0.75),
)
"""Round laws; a load of 100 s that a recovery from peers must not pay."""
JOB = Timeline(3.6e6, 1800.0, 120.0, 0.0, 100.0, 0.0, 400.0, 14400.0, 0.0)
"""A campaign of 250 failures' worth at MTBF 4 h, every failure the job path's."""
MIXED = dataclasses.replace(JOB, peers=PeersPath(share=0.75, detect_s=30.0, restart_s=250.0, lost_s=20.0))
"""Three quarters of them recovered from peers at 300 s each, where the job path loses half an interval, D and R
(1400 s): 5.4 points of goodput the expectation must count."""


@functools.cache
def goodput(*overrides: str) -> GoodputPlan:
    return build_plan(compose("train_segment", list(overrides)), with_remedies=False).goodput


def test_each_term_follows_its_inputs():
    """1024 ranks, 10 GB of a rank's state, 20 GB/s of network, 40 GB/s to host and 16 GB/s of CRC, by hand: the
    start-up's parts but the load (16.774 s), the transfer 0.5 s, the CRC on both sides 2 x 10 x (1/40 + 1/10) = 2.5 s,
    the warm-up 0.75 s, after 30 s of detection; half of an 8 s step lost, the whole step to the first step's end."""
    h = dataclasses.replace(
        compose("train_segment", list(SEED)).cluster.hardware,
        startup=LAWS,
        inter_node_gbps=20.0,
        inter_node_latency_us=0.0,
        host_copy_gbps=40.0,
        crc_gbps=10.0,
        hang_share=0.25,
    )
    measured = {"imports": "run a", "crc_gbps": "run b", "host_copy_gbps": "run b"}
    startup = plan_startup(h, measured, world=1024, step_s=8.0)
    r = plan_peers(h, measured, detect_s=30.0, timeout_s=300.0, state_bytes=10e9, step_s=8.0, startup=startup)
    seconds = {t.name: t.seconds for t in r.terms}
    assert seconds == pytest.approx(
        {
            "detection": 30.0,
            "verdict": 1.0,
            "launch": 2.0,
            "imports": 3.0,
            "rendezvous": 0.5 + 1.024,
            "communicators": 0.25 + 5.0,
            "build": 4.0,
            "transfer": 0.5,
            "crc": 2.5,
            "warm-up": 0.75,
        }
    )
    assert list(seconds)[0] == "detection" and "load" not in seconds
    assert r.recover_s == pytest.approx(50.524) and r.lost_s == 4.0 and r.first_step_s == pytest.approx(58.524)
    assert r.path() == pytest.approx(PeersPath(share=0.75, detect_s=30.0, restart_s=20.524, lost_s=4.0))
    labels = {t.name: t.label for t in r.terms}
    assert labels["imports"] == "measured at scale: run a" and labels["crc"] == "measured at scale: run b"
    assert labels["transfer"] == labels["detection"] == labels["build"] == "not measured at scale"


def test_without_start_up_parts_the_start_is_a_hot_restarts_whole():
    h = dataclasses.replace(compose("train_segment", list(SEED)).cluster.hardware, startup=None, hot_restart_s=12.0)
    startup = plan_startup(h, {}, world=8, step_s=1.0)
    r = plan_peers(h, {}, detect_s=5.0, timeout_s=60.0, state_bytes=1e9, step_s=1.0, startup=startup)
    assert [t.name for t in r.terms] == ["detection", "start-up", "transfer", "crc"]
    assert r.terms[1].seconds == 12.0 and "hot_restart_s" in r.terms[1].how


def test_the_expectation_of_two_kinds_is_the_simulations_mean():
    """The peers path's pauses in the renewal expectation against 4000 seeded trials: the mean within 0.2 points, the
    5-95 % band within 0.2 points. The closed form by hand: the job path's (1 - 1400/14400) / (1 + 120/1800), the two
    kinds' (1 - (0.25 x 1400 + 0.75 x 300)/14400) / (1 + 120/1800); the expectation gains what it gains."""
    sim = simulate(MIXED, trials=4000, seed=3)
    mean, low, high = expected(MIXED)
    assert mean == pytest.approx(sim.mean(), abs=0.002)
    assert (low, high) == pytest.approx(tuple(np.percentile(sim, (5, 95))), abs=0.002)
    job_closed, mixed_closed = (1 - 1400 / 14400) / (1 + 120 / 1800), (1 - 575 / 14400) / (1 + 120 / 1800)
    assert closed_form(JOB)[0] == pytest.approx(job_closed) and closed_form(MIXED)[0] == pytest.approx(mixed_closed)
    assert mean - expected(JOB)[0] == pytest.approx(mixed_closed - job_closed, abs=0.003)
    # A failure per MTBF of held time: a quarter add D (no failure strikes in it), three quarters their 300 s.
    assert failures(MIXED) == pytest.approx(MIXED.work_s / sim.mean() / (14400 + 0.25 * 100 + 0.75 * 300), rel=0.01)


def test_where_every_failure_is_recovered_from_peers_the_spread_is_the_recoveries_alone():
    """No job path at MTBF 0.4 h: the campaign's 3839880 s of training and saves are held without a rollback, its
    recoveries Poisson in them at 300 s each: mean E (1 + 300/1440), variance E 300^2/1440, by hand and sampled."""
    every = dataclasses.replace(MIXED, mtbf_s=1440.0, peers=dataclasses.replace(MIXED.peers, share=1.0))
    exposed = 3.6e6 + 1999 * 120
    wall, sigma = exposed * (1 + 300 / 1440), np.sqrt(exposed * 300**2 / 1440)
    by_hand = (JOB.work_s / wall * (1 + (sigma / wall) ** 2), JOB.work_s / (wall + 1.6449 * sigma))
    assert expected(every)[:2] == pytest.approx(by_hand, rel=1e-9)
    sim = simulate(every, trials=4000, seed=5)
    assert expected(every) == pytest.approx((sim.mean(), *np.percentile(sim, (5, 95))), abs=0.0005)
    assert np.percentile(sim, 95) - np.percentile(sim, 5) > 0.007  # the spread the pauses' variance must give


def test_no_failure_recovered_from_peers_is_the_job_paths_model_exactly():
    """A peers path of share 0 (hang_share 1) changes no draw and no figure, whatever its costs."""
    none = dataclasses.replace(JOB, peers=PeersPath(share=0.0, detect_s=30.0, restart_s=250.0, lost_s=20.0))
    assert (simulate(none, trials=50, seed=1) == simulate(JOB, trials=50, seed=1)).all()
    assert expected(none) == expected(JOB) and failures(none) == failures(JOB) and closed_form(none) == closed_form(JOB)
    hangs = (*SEED, "cluster.hardware.hang_share=1")
    job, peers = goodput(*hangs).configured, goodput(*hangs, "resilience.recovery=peers").configured
    same = ("simulated", "simulated_low", "simulated_high", "closed_form", "detect_s", "restart_s", "failures")
    assert {k: getattr(peers, k) for k in same} == {k: getattr(job, k) for k in same}


def test_the_seeds_campaign_keeps_more_recovering_from_peers():
    """llama70b_alps (dp64 replicas, 12 spare nodes) at MTBF 4 h: 78 % of failures recovered from peers in about
    49 s and half an 11.4 s step where the job path costs a hang 114 s + 167 s and half an interval: 97.8 %, against
    96.0 % recovering as a job; the what-if of the job config is the same campaign."""
    job, peers = goodput(*SEED), goodput(*PEERS)
    p = peers.peers
    assert p.configured and p.recovery.share == pytest.approx(0.78) and p.scenario == peers.configured
    assert p.recovery.recover_s == pytest.approx(48.6, abs=0.5) and p.recovery.lost_s == pytest.approx(5.68, abs=0.01)
    assert p.job_first_step_s == pytest.approx(114 + 167, abs=2)  # a hang: the heartbeat, then a hot restart's load
    assert peers.configured.simulated > job.configured.simulated + 0.01
    assert peers.configured.closed_form > job.configured.closed_form + 0.01
    assert peers.configured.detect_s == pytest.approx(job.configured.detect_s)  # 78 % x 30 s + 22 % x 114 s, as before
    assert peers.configured.restart_s < job.configured.restart_s / 2
    assert not job.peers.configured and job.peers.scenario.simulated == peers.configured.simulated
    assert [s.simulated for s in job.scenarios] == pytest.approx([0.360, 0.960, 0.960], abs=0.001)  # unchanged


def test_the_plan_prints_every_term_with_its_label(capsys):
    where = "run alps-70b, 4096 ranks"
    assert main([*PEERS, f"+cluster.measured.inter_node_gbps='{where}'"]) == 0
    table = capsys.readouterr().out
    section = table[table.index("Recovery from peers at 4096 ranks, as configured") :].split("\n\n")[0].splitlines()
    rows = {line.split()[0]: line for line in section[1:] if not line.lstrip().startswith("-")}
    terms = ["detection", "verdict", "launch", "imports", "rendezvous", "communicators", "build", "transfer", "crc"]
    assert list(rows) == [*terms, "warm-up", "recovery", "lost", "first", "goodput", "file"]
    assert rows["transfer"].endswith(f"measured at scale: {where}")
    assert all(rows[t].endswith("not measured at scale") for t in terms if t not in ("transfer", "crc"))
    assert rows["crc"].endswith("not measured at scale (host_copy_gbps, crc_gbps)")
    assert "resilience.failure_detect_s" in rows["detection"] and "collective timeout, 300 s" in section[-1]
    assert "97.8%" in rows["goodput"] and rows["goodput"].endswith("(as configured)")
    assert "failure to first step" in rows["first"] and "on the job path 280 s" in rows["first"]


def test_a_config_the_rules_refuse_peers_prints_why(capsys):
    with pytest.raises(ConfigError, match="cluster.allocation.spare_nodes is 0"):
        compose("train_segment", [*PEERS, "cluster.allocation.spare_nodes=0"])
    assert main([*SEED, "cluster.allocation.spare_nodes=0"]) == 0
    table = capsys.readouterr().out
    assert "Recovery from peers (resilience.recovery=peers): refused by the rules: invalid config: " in table
    assert goodput(*SEED, "cluster.allocation.spare_nodes=0").peers.scenario is None


def snapshots_at(*, replicas: int = 64, capacity_gb: float = 300.0, other_gb: float = 0.0, step_s: float = 8.0):
    """10 GB of a rank's state every 10 steps of `step_s`, 4 ranks a node, 40 GB/s to host, 20 GB/s of network,
    10 GB/s of CRC; only the network measured at scale."""
    h = dataclasses.replace(
        compose("train_segment", list(SEED)).cluster.hardware, host_copy_gbps=40.0, inter_node_gbps=20.0, crc_gbps=10.0
    )
    return plan_snapshots(
        h,
        {"inter_node_gbps": "run c"},
        steps=10,
        step_s=step_s,
        replicas=replicas,
        state_bytes=10e9,
        ranks_per_node=4,
        other_bytes_per_node=other_gb * 1e9,
        capacity_bytes=capacity_gb * 1e9,
    )


def test_each_snapshot_term_follows_its_inputs():
    """By hand: the copy 10/40 = 0.25 s blocks; the exchange 10/20 = 0.5 s and the CRC of both copies 2 x 10/10 = 2 s
    run in the background, 2.5 s hidden in the 80 s between snapshots: 0.25 s blocking every 80 s, 0.3125 % of the
    steps' time; 6 x 10 GB x 4 ranks = 240 GB a node at the peak. With 64 replicas a failure loses half a step; with
    one copy of each shard, half the interval plus one more at 2.5 / 80: 10 x (0.5 + 0.03125) = 5.3125 steps."""
    n = snapshots_at()
    assert {t.name: t.seconds for t in n.terms} == pytest.approx({"host copy": 0.25, "exchange": 0.5, "crc": 2.0})
    assert n.copy_s == pytest.approx(0.25) and n.background_s == pytest.approx(2.5) and n.interval_s == 80.0
    assert n.waits_s == 0.0 and n.blocking_s == pytest.approx(0.25) and n.share == pytest.approx(0.003125)
    assert n.host_bytes_per_node == 240e9 and n.refused is None
    labels = {t.name: t.label for t in n.terms}
    assert labels == {
        "host copy": "not measured at scale",
        "exchange": "measured at scale: run c",
        "crc": labels["crc"],
    }
    assert labels["crc"] == "not measured at scale"
    assert n.lost_steps == 0.5 and snapshots_at(replicas=1).lost_steps == pytest.approx(5.3125)


def test_a_background_longer_than_the_interval_blocks_its_excess():
    """Steps of 0.2 s: 2 s between snapshots, the 2.5 s background 0.5 s longer, which the next snapshot waits: 0.25 +
    0.5 = 0.75 s blocking every 2 s, 37.5 %; every failure strikes during an exchange, 15 steps lost without a
    replica. The table says the next waits."""
    n = snapshots_at(step_s=0.2, replicas=1)
    assert n.waits_s == pytest.approx(0.5) and n.blocking_s == pytest.approx(0.75) and n.share == pytest.approx(0.375)
    assert n.during_exchange == 1.0 and n.lost_steps == pytest.approx(15.0)
    lines = snapshot_lines(n)
    background = next(line for line in lines if line.split()[0] == "background")
    assert "longer than the 2 s between snapshots: the next waits 0.5 s" in background
    assert "hidden" in next(line for line in snapshot_lines(snapshots_at()) if line.split()[0] == "background")


def test_snapshots_a_nodes_host_memory_cannot_hold_are_refused_in_one_line(capsys):
    """240 GB of copies at the peak beside 30 GB of async staging in 260 GB: refused, the values and the fix named; in
    270 GB they fit. The seed at mem_gb 400: 4 x 6 x 14.41 GB = 346 GB beside 57.7 GB of async staging, printed
    (two copies each, as before the background exchange, would have fit)."""
    assert snapshots_at(capacity_gb=270.0, other_gb=30.0).refused is None
    refused = snapshots_at(capacity_gb=260.0, other_gb=30.0).refused
    assert refused == (
        "checkpoint.snapshot_steps does not fit: 4 ranks per node hold 6 x 10 GB each (4 copies, 6 while an exchange "
        "runs), 240 GB beside 30 GB of other host memory of 260 GB (cluster.allocation.mem_gb); give the job more host "
        "memory, spread the state over more ranks, or set checkpoint.snapshot_steps=0"
    )
    assert main([*SNAPSHOTS, "cluster.allocation.mem_gb=400"]) == 0
    lines = [line for line in capsys.readouterr().out.splitlines() if line.startswith("SNAPSHOTS REFUSED")]
    assert len(lines) == 1 and "346 GB beside 57.7 GB of other host memory of 400 GB" in lines[0]


def test_without_snapshots_the_peers_goodput_is_unchanged():
    """snapshot_steps=0 (the default) plans no snapshot and leaves every figure of the peers campaign as it was:
    half a step lost, no snapshot share, 97.8 %."""
    peers, zero = goodput(*PEERS), goodput(*PEERS, "checkpoint.snapshot_steps=0")
    assert peers.peers.snapshots is None and zero == peers
    assert peers.peers.recovery.lost_s == pytest.approx(peers.peers.recovery.step_s / 2)
    assert peers.configured.simulated == pytest.approx(0.978, abs=0.001)
    assert closed_form(dataclasses.replace(MIXED, snapshot_share=0.0)) == closed_form(MIXED)


def test_snapshots_cost_the_seed_their_blocking_share_and_no_more():
    """The seed with snapshots every 10 steps: 14.41 GB copied at 450 GB/s, 0.032 s blocking every 114 s of steps
    (0.028 %), paid on every step; the exchange at 25 and CRC at 2 x 16 GB/s, 2.38 s, hidden; 64 replicas, so no failure
    restores from them and the lost work stays half a step. Its goodput is the one without them over 1 + that share,
    within what the longer stretches add to lost work: 97.8 % still."""
    plain, snap = goodput(*PEERS), goodput(*SNAPSHOTS)
    n = snap.peers.snapshots
    assert n.blocking_s == pytest.approx(14.41 / 450, rel=1e-3) and n.waits_s == 0.0
    assert n.background_s == pytest.approx(14.41 / 25 + 2 * 14.41 / 16, rel=1e-3)
    assert n.share == pytest.approx(n.blocking_s / (10 * snap.peers.recovery.step_s)) and 0.00025 < n.share < 0.0003
    assert n.host_bytes_per_node == pytest.approx(4 * 6 * 14.41e9, rel=1e-3) and n.refused is None
    assert snap.peers.recovery.lost_s == plain.peers.recovery.lost_s
    bound = plain.configured.simulated / (1 + n.share)
    assert bound - 0.002 < snap.configured.simulated <= bound + 0.0005
    assert snap.configured.simulated == pytest.approx(0.978, abs=0.001)
    assert snap.configured.terms["checkpoint"] == pytest.approx(plain.configured.terms["checkpoint"] + n.share)
    baseline = [plain.scenarios[0].simulated, snap.scenarios[0].simulated]
    assert baseline[0] == baseline[1]  # the baseline recovers as a job: no snapshots


def test_without_replicas_a_failure_loses_half_the_snapshot_interval(capsys):
    """dp64 fully sharded holds one copy of each shard: the rules take it with snapshots, every peers-path failure
    goes back to the newest snapshot complete: 5 steps lost on average, and 10 more at the chance (0.037 s of
    background in 113 s) it strikes during an exchange, printed with the snapshots' terms and labels."""
    shard = (*SNAPSHOTS, "parallel.dp_mode=shard")
    p = goodput(*shard).peers
    n = p.snapshots
    assert n.replicas == 1 and n.during_exchange == pytest.approx(n.background_s / (10 * p.recovery.step_s))
    assert p.recovery.lost_s == pytest.approx((5 + 10 * n.during_exchange) * p.recovery.step_s)
    assert 5 < n.lost_steps < 5.01
    assert main(list(shard)) == 0
    table = capsys.readouterr().out
    section = table[table.index("Recovery from peers at 4096 ranks") :].split("\n\n")[0]
    assert "half the snapshot interval on average, plus one more at the 0.03% chance" in section
    rows = {line.split()[0]: line for line in section.splitlines() if line.startswith("    ") and "-" not in line[:6]}
    assert list(rows)[:3] == ["host", "exchange", "crc"] and all(
        rows[r].endswith("not measured at scale") for r in ("host", "exchange", "crc")
    )
    assert "every failure above: the layout holds 1 copy of each shard" in section


@functools.cache
def campaign(*overrides: str):
    return build_plan(compose("train_segment", list(overrides)), with_remedies=False).campaign


def test_file_system_interval_plans_on_the_job_paths_mtbf():
    """The seed's 847 GB written in 121 s at 7 GB/s, a step of 11.37 s, MTBF 4 h, hang_share 0.22, by hand: as a job,
    sqrt(2 x 121 x 14400) = 1866 s = 164 steps; from peers only the hangs need the file system, sqrt(2 x 121 x 14400 /
    0.22) = 3979 s = 350 steps (the baseline, which does not recover from peers, keeps 164); with hang_share 0 none
    does: checkpoint.max_interval_steps; a fixed interval stays as configured. Printed in the peers section."""
    sync = ("checkpoint.mode=sync", "checkpoint.interval_steps=0")
    job, peers = campaign(*SEED, *sync), campaign(*PEERS, *sync)
    assert (job.interval_steps, peers.interval_steps, peers.job_interval_steps) == (164, 350, 164)
    step_s = job.interval_s / job.interval_steps
    assert peers.interval_steps == round((2 * peers.save_s * 14400 / 0.22) ** 0.5 / step_s)
    assert peers.waste < job.waste
    g = goodput(*PEERS, *sync)
    assert [s.interval_steps for s in g.scenarios[:2]] == [164, 350]  # the baseline, as configured
    none = campaign(*PEERS, *sync, "cluster.hardware.hang_share=0")
    assert none.interval_steps == compose("train_segment", list(SEED)).checkpoint.max_interval_steps
    assert none.asynchronous.interval_steps == none.interval_steps
    fixed = ("checkpoint.mode=sync", "checkpoint.interval_steps=40")
    assert campaign(*PEERS, *fixed).interval_steps == campaign(*SEED, *fixed).interval_steps == 40
    out = "\n".join(peers_lines(goodput(*SNAPSHOTS, *sync).peers))
    assert "every 350 steps: Young/Daly at the job path's MTBF, mtbf_hours / hang_share = 4 / 0.22 = 18.2 h" in out
    assert "every 10 steps (checkpoint.snapshot_steps)" in out
