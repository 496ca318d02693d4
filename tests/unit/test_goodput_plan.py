"""trainflow.plan.goodput: the seed's campaign pinned with and without the remedies, the Monte Carlo against the closed
form in every scenario, remedies and the MTBF in the direction they must push, and a deterministic simulation."""

from __future__ import annotations

import functools
import json
import time

import pytest

from trainflow.badput import GOODPUT_MEASUREMENT, MEASURED, Badput
from trainflow.config import compose
from trainflow.plan.__main__ import main
from trainflow.plan.build import build_plan
from trainflow.plan.failures import Timeline, closed_form, simulate
from trainflow.plan.from_run import TERMS
from trainflow.plan.goodput import GOAL, GoodputPlan
from trainflow.plan.scenarios import SCENARIOS
from trainflow.resilience.goodput import TERMS as MEASURED_TERMS

SEED = ("experiment=llama70b_alps",)
CASES = [SEED, (), (*SEED, "cluster.hardware.mtbf_hours=2"), (*SEED, "cluster.hardware.mtbf_hours=16")]
"""Where the first-order closed form holds: at MTBF 1 h the seed's baseline loses 40 % to failures, and the
simulation gives 6 points more than the closed form (which counts failures over the wall time, waits included)."""


@functools.cache
def goodput(*overrides: str) -> GoodputPlan:
    return build_plan(compose("train_segment", list(overrides)), with_remedies=False).goodput


def by_name(plan: GoodputPlan) -> dict:
    return {s.name: s for s in plan.scenarios}


def test_the_seeds_campaign_as_configured_and_with_every_remedy():
    """The seed's 70B campaign at MTBF 4 h, as its experiment configures it (issue 32): async checkpoints every 20
    steps, trainflow's detection, hot restarts on 12 spare nodes (hot_restart_s and startup_s: the start-up model's
    35.8 s at 4096 ranks, plan.startup), the load read once (111 s at 7.6 GB/s, then 0.5 s gathering over the dp
    links), 24 h jobs, evaluation every 1000 steps: 96.0 %, every remedy built (95.7 % with the local Slurm drills'
    24.9 s and the 300 s start-up assumed before). The baseline (sync, the collective timeout, a new job whose load
    each of the 64 replicas reads for itself: 7130 s) keeps 36.0 %. Before the single read and the hot restart were
    built, the configured campaign kept 48.8 %."""
    s = by_name(goodput(*SEED))
    base, configured, best = s["baseline (sync, timeout)"], s["as configured"], s["all remedies"]
    start = 35.8  # plan.startup's sum at 4096 ranks, a new job's and a hot restart's alike to 0.01 s
    assert base.blocking_s == pytest.approx(121, abs=1) and base.interval_steps == 20  # checkpoint.interval_steps
    assert base.detect_s == 300 and base.restart_s == pytest.approx(300 + start + 7130, abs=5) and base.built
    assert configured.blocking_s < 1 and configured.interval_s >= configured.write_s == base.blocking_s
    assert configured.detect_s == pytest.approx(0.78 * 30 + 0.22 * 114, abs=1) and configured.built
    check = 0.10 * (start + 5.4)  # a tenth of the failures first check the hosts: a job step and the gate's sweep
    assert configured.restart_s == pytest.approx(start + 111.9 + check, abs=1)  # hot restart + the single read
    assert configured.simulated == pytest.approx(0.960, abs=0.005) and configured.meets_goal
    assert set(s) == {"baseline (sync, timeout)", "as configured", "all remedies"}  # async and spares configured
    assert best.restart_s == configured.restart_s and best.built and best.meets_goal
    assert best.terms["evaluation"] == pytest.approx(8 / 3000) and best.terms["start-up"] == pytest.approx(
        0.008, abs=0.001
    )
    assert best.simulated_low < best.simulated < best.simulated_high
    unbuilt = by_name(goodput(*SEED, "cluster.allocation.spare_nodes=0"))
    check = 0.10 * (300 + start + 5.4)  # the hosts' checks as a job of their own
    assert unbuilt["as configured"].restart_s == pytest.approx(300 + start + 111.9 + check, abs=1)  # a new job
    assert "+ hot restart" in unbuilt and "+ async checkpoints" in by_name(goodput())  # the default: sync, no spares


@pytest.mark.parametrize("overrides", CASES, ids=lambda o: " ".join(o) or "default")
def test_the_simulation_and_the_closed_form_agree_within_3_percent_while_failures_cost_up_to_30(overrides):
    for s in goodput(*overrides).scenarios:
        if s.terms["lost work"] + s.terms["detection"] + s.terms["restart"] <= 0.3:  # first order holds
            assert abs(s.simulated - s.closed_form) <= 0.03, s


@pytest.mark.parametrize(
    "overrides", [*CASES, (*SEED, "cluster.hardware.mtbf_hours=1")], ids=lambda o: " ".join(o) or "default"
)
def test_a_remedy_never_lowers_goodput(overrides):
    """Strictly in the closed form; in the simulation within its noise (the scenarios share their seed)."""
    s = by_name(goodput(*overrides))
    base, best = s[SCENARIOS[0].name], s["all remedies"]
    for name in list(s)[1:]:
        assert base.closed_form <= s[name].closed_form <= best.closed_form, name
        assert base.simulated <= s[name].simulated + 0.002 and s[name].simulated <= best.simulated + 0.002, name


def test_a_shorter_mtbf_lowers_goodput_in_every_scenario():
    longer, shorter = by_name(goodput(*SEED)), by_name(goodput(*SEED, "cluster.hardware.mtbf_hours=2"))
    for name in longer:
        assert shorter[name].simulated < longer[name].simulated and shorter[name].closed_form < longer[name].closed_form


def test_the_simulation_is_deterministic_for_its_seed_and_fast():
    times = Timeline(
        work_s=3.6e6,
        interval_s=1800.0,
        blocking_s=120.0,
        write_s=0.0,
        detect_s=300.0,
        wait_s=300.0,
        held_s=400.0,
        mtbf_s=14400.0,
        jobs_s=0.0,
    )
    start = time.perf_counter()
    first = simulate(times, trials=400, seed=1)
    assert time.perf_counter() - start < 1.0
    assert (first == simulate(times, trials=400, seed=1)).all()
    assert not (first == simulate(times, trials=400, seed=2)).all()
    cfg = compose("train_segment", list(SEED))
    assert build_plan(cfg, with_remedies=False).goodput == build_plan(cfg, with_remedies=False).goodput


def test_without_failures_the_simulation_is_the_checkpoints_and_job_starts_exactly():
    times = Timeline(
        work_s=1000.0,
        interval_s=300.0,
        blocking_s=10.0,
        write_s=5.0,
        detect_s=0.0,
        wait_s=0.0,
        held_s=0.0,
        mtbf_s=1e15,
        jobs_s=50.0,
    )
    assert simulate(times, trials=4, seed=0) == pytest.approx(1000 / (1000 + 3 * 10 + 50))  # 4 pieces, 3 saves
    closed, terms = closed_form(times)
    assert terms["checkpoint"] == pytest.approx(10 / 300) and closed == pytest.approx(1 / (1 + 10 / 300 + 0.05))


def test_the_command_prints_the_goodput_section_and_its_json(capsys):
    assert main(list(SEED)) == 0
    table = capsys.readouterr().out
    assert "Goodput under failures (MTBF 4 h" in table
    assert all(s.name in table for s in goodput(*SEED).scenarios) and f"misses {GOAL:.0%}" in table
    assert "(not built)" not in table and "evaluation 0.3% in every scenario" in table
    assert main(["--json", *SEED]) == 0
    carried = json.loads(capsys.readouterr().out)["goodput"]
    assert GoodputPlan.from_json(carried) == goodput(*SEED) and carried["goal"] == GOAL


def test_every_input_of_the_seeds_goodput_says_whether_a_run_at_scale_measured_it(capsys):
    main(["experiment=llama70b_alps"])
    table = capsys.readouterr().out
    shown = table[table.index("Goodput inputs") :].split("\n\n")[0].splitlines()[1:]
    labels = {line.split()[0]: line for line in shown}
    assert set(labels) == {
        "mtbf_hours", "hang_share", "symmetric_share", "requeue_wait_s", "startup_s", "hot_restart_s",
        "storage_write_gbps", "checkpoint_read_gbps", "host_copy_gbps", "inter_node_gbps", "crc_gbps",
    }  # fmt: skip
    at_scale = {name for name, line in labels.items() if "measured at scale: the seed's 4096-GH200" in line}
    assert at_scale == {"mtbf_hours", "storage_write_gbps"}
    summed = {"startup_s", "hot_restart_s"}  # the start-up model's, each part labelled below (test_startup_plan.py)
    assert all(labels[name].endswith("the start-up's parts at 4096 ranks (below), each labelled") for name in summed)
    assert all(line.endswith("not measured at scale") for name, line in labels.items() if name not in at_scale | summed)
    assert "35.848 s" in labels["hot_restart_s"]  # fitted to drills of 2 ranks: not a 4096-rank restart


@pytest.mark.parametrize(
    ("override", "message"),
    [
        ("+cluster.measured.startup_time=x", "cluster.measured has 'startup_time', no input of the goodput plan"),
        ("+cluster.measured.startup_s='run a\trun b'", "cluster.measured.startup_s must say where it was measured"),
    ],
)
def test_a_measured_label_that_is_no_input_or_no_line_is_refused(override, message):
    with pytest.raises(Exception, match=message):
        compose("train_segment", ["experiment=llama70b_alps", override])


def test_restarts_after_a_failure_no_evidence_pins_pay_the_hosts_check():
    """symmetric_share of the failures have the job's hosts checked before the restart (launch.supervisor's gate step
    with spares, a job of its own without): R grows by that share of the check's start and sweep, the baseline's
    (which has no such check) not at all."""
    none = by_name(goodput(*SEED, "cluster.hardware.symmetric_share=0"))
    half = by_name(goodput(*SEED, "cluster.hardware.symmetric_share=0.5"))
    plan = build_plan(compose("train_segment", [*SEED]), with_remedies=False)
    sweep = next(n for n in plan.goodput.notes if "the gate's sweep" in n)
    assert "a job step on the allocation: 41 s (hot_restart_s 36 s and the gate's sweep 5.4 s)" in sweep
    extra = half["as configured"].restart_s - none["as configured"].restart_s
    assert extra == pytest.approx(0.5 * (plan.startup.hot_restart_s + 5.4), abs=0.1)
    assert half["baseline (sync, timeout)"].restart_s == none["baseline (sync, timeout)"].restart_s
    assert half["as configured"].simulated < none["as configured"].simulated


def test_the_plan_and_the_report_name_their_badput_by_one_taxonomy():
    """trainflow.badput: the closed form's terms, the planned-against-measured terms and the report's table are its
    categories, each mapped to ml-goodput-measurement's BadputType; every measured term of a segment counts in one."""
    configured = by_name(goodput(*SEED))["as configured"]
    assert list(configured.terms) == list(Badput) == list(TERMS)
    assert set(GOODPUT_MEASUREMENT) == set(Badput) and all(GOODPUT_MEASUREMENT.values())
    assert set(MEASURED) == set(MEASURED_TERMS) and {c for c in MEASURED.values() if c} == set(Badput)
