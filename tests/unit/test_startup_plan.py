"""trainflow.plan.startup: a start-up is the sum of its parts, each a law in the world size, which the goodput plan
takes as startup_s and hot_restart_s; a value the cluster sets overrides the sum and keeps its label; the plan prints
every part with its law and whether a run at scale measured it."""

from __future__ import annotations

import dataclasses

import pytest

from trainflow.config import compose
from trainflow.config.startup import PartLaw, StartupConfig, StartupPart
from trainflow.plan.__main__ import main
from trainflow.plan.build import build_plan
from trainflow.plan.startup import plan_startup

SEED = ("experiment=llama70b_alps",)
LAWS = StartupConfig(
    fitted="round numbers",
    verdict=PartLaw(1.0),
    launch=PartLaw(2.0),
    imports=PartLaw(3.0),
    rendezvous=PartLaw(0.5, per_rank_s=0.001),
    communicators=PartLaw(0.25, per_doubling_s=0.5),
    build=PartLaw(1.0),
    load=PartLaw(0.5, per_rank_s=0.002),
    first_step=PartLaw(0.75),
)


@pytest.mark.parametrize(
    ("world", "laws"),
    [
        (2, {"rendezvous": 0.502, "communicators": 0.75, "load": 0.504, "first_step": 0.85}),
        (4096, {"rendezvous": 4.596, "communicators": 6.25, "load": 8.692, "first_step": 0.85}),
    ],
)
def test_each_part_follows_its_law_and_the_sums_add_them(world, laws):
    hardware = dataclasses.replace(
        compose("train_segment", list(SEED)).cluster.hardware, startup=LAWS, startup_s=None, hot_restart_s=None
    )
    plan = plan_startup(hardware, {}, world=world, step_s=0.1)
    seconds = {p.part.value: p.seconds for p in plan.parts}
    assert list(seconds) == [p.value for p in StartupPart]
    assert seconds == pytest.approx({"verdict": 1.0, "launch": 2.0, "imports": 3.0, "build": 1.0, **laws})
    assert plan.hot_restart_s == pytest.approx(sum(seconds.values()))
    assert plan.startup_s == pytest.approx(plan.hot_restart_s - 1.0)  # a new job has no supervisor's verdict
    assert not plan.startup_set and not plan.hot_restart_set
    laws = {p.part.value: p.law for p in plan.parts}
    assert laws["rendezvous"] == f"0.5 s + 0.001 s x {world} ranks" and laws["first_step"] == "0.75 s + one step 0.1 s"


def test_the_seeds_plan_takes_the_models_sums_at_4096_ranks():
    plan = build_plan(compose("train_segment", list(SEED)), with_remedies=False)
    startup = plan.startup
    assert startup.world == 4096 and not startup.hot_restart_set and not startup.startup_set
    assert plan.hardware["hot_restart_s"] == startup.hot_restart_s == pytest.approx(startup.summed(hot=True))
    assert plan.hardware["startup_s"] == startup.startup_s < startup.hot_restart_s
    check = 0.10 * (startup.hot_restart_s + 5.4)  # a tenth of the failures first check the hosts
    assert plan.goodput.configured.restart_s == pytest.approx(startup.hot_restart_s + 111.9 + check, abs=1)


def test_a_value_the_cluster_sets_overrides_the_sum_and_keeps_its_label(capsys):
    plan = build_plan(compose("train_segment", [*SEED, "cluster.hardware.hot_restart_s=24.9"]), with_remedies=False)
    assert plan.startup.hot_restart_s == plan.hardware["hot_restart_s"] == 24.9 and plan.startup.hot_restart_set
    assert plan.goodput.configured.restart_s == pytest.approx(24.9 + 111.9 + 0.10 * (24.9 + 5.4), abs=1)
    main([*SEED, "cluster.hardware.hot_restart_s=24.9"])
    table = capsys.readouterr().out
    inputs = table[table.index("Goodput inputs") :].split("\n\n")[0]
    assert "hot_restart_s                24.9 s     not measured at scale" in inputs
    assert "startup_s" in inputs and "the start-up's parts at 4096 ranks (below), each labelled" in inputs
    assert "set to 24.9 s, which overrides the parts' sum" in table
    main(["cluster=local"])  # local sets both and gives no model: as before, no parts to print
    table = capsys.readouterr().out
    assert "Start-up at" not in table and "hot_restart_s                  10 s     not measured at scale" in table


def test_the_plan_prints_every_part_with_its_law_and_label(capsys):
    main([*SEED, "+cluster.measured.rendezvous='run alps-70b, 4096 ranks'"])
    table = capsys.readouterr().out
    shown = table[table.index("Start-up at 4096 ranks") :].split("\n\n")[0].splitlines()
    assert "cluster.hardware.startup: " in shown[0]
    lines = {line.split()[0]: line for line in shown[1:]}
    assert list(lines) == [*(p.value for p in StartupPart), "startup_s", "hot_restart_s"]
    assert lines["rendezvous"].endswith("measured at scale: run alps-70b, 4096 ranks")
    assert all(lines[p].endswith("not measured at scale") for p in StartupPart if p != "rendezvous")
    assert "x 4096 ranks" in lines["load"] and "one step" in lines["first_step"]


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        (["cluster=local", "cluster.hardware.startup_s=null"], "cluster.hardware.startup_s is unset"),
        ([*SEED, "+cluster.measured.linking=x"], "cluster.measured has 'linking', no input of the goodput plan"),
    ],
)
def test_a_start_up_without_a_value_or_a_model_and_an_unknown_part_are_refused(overrides, message):
    with pytest.raises(Exception, match=message):
        compose("train_segment", overrides)
