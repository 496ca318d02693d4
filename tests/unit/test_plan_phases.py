"""trainflow.plan over a campaign's phases: every phase planned as its jobs compose it and totalled, within seconds;
a phase that cannot run refused in one line naming it; phase=<name> planned alone. (A config without phases prints
what it always printed: tests/unit/test_plan.py.)"""

from __future__ import annotations

import contextlib
import io
import json
import time

import pytest

from trainflow.plan.__main__ import main
from trainflow.plan.phases import PhasesPlan, render_phases

CAMPAIGN = "experiment=llama70b_alps_campaign"
NAMES = ["pretrain", "long_context", "anneal"]


@pytest.fixture(scope="module")
def campaign() -> tuple[PhasesPlan, float]:
    """The command's JSON for the campaign, read back, and the seconds the command took."""
    out, start = io.StringIO(), time.perf_counter()
    with contextlib.redirect_stdout(out):
        assert main([CAMPAIGN, "--json"]) == 0
    return PhasesPlan.from_json(json.loads(out.getvalue())), time.perf_counter() - start


def test_the_campaign_plans_every_phase_within_seconds_and_its_total_is_their_sum(campaign):
    plan, seconds = campaign
    print(f"planned {len(NAMES)} phases in {seconds:.2f} s")
    assert seconds < 30  # about 2 s: the bound only catches a plan gone slower by an order
    assert [p.name for p in plan.phases] == NAMES
    assert plan.phases[2].series.startswith(f"{plan.phases[1].series}-anneal-")  # the anneal continues long_context
    camps = [p.plan.campaign for p in plan.phases]
    assert [c.steps for c in camps] == [1_044_000, 12_000, 105_600]
    assert plan.total.steps == sum(c.steps for c in camps) and plan.total.tokens == sum(c.tokens for c in camps)
    assert [camps[0].tokens, camps[1].tokens] == [1_044_000 * 1024 * 8192, 12_000 * 64 * 131072]
    assert [p.plan.setup.layout.cp for p in plan.phases] == [1, 16, 16]
    assert plan.total.facility_mwh == pytest.approx(1e3 * sum(c.facility_gwh for c in camps))
    goodputs = [p.figures.goodput for p in plan.phases]
    assert min(goodputs) < plan.total.goodput < max(goodputs)  # weighted by wall time: pretrain's holds most
    assert plan.total.wall_hours > plan.total.hours  # failures and job starts cost wall time


def test_the_table_prints_each_phase_then_the_total(campaign):
    lines = render_phases(campaign[0]).splitlines()
    assert [line.split(":")[1].split()[0] for line in lines if line.startswith("== Phase")] == NAMES
    assert lines[-1].split()[:2] == ["total", str(1_044_000 + 12_000 + 105_600)]


@pytest.mark.parametrize(
    ("overrides", "says"),
    [
        ('"cluster.allocation.mem_gb=0.001"', "the plan does not fit"),  # memory
        ('"parallel.dp=4096","train.global_batch=4096"', "the local world of 4096 ranks"),  # this machine
        ('"model.n_layers=2"', "model.n_layers(2)"),  # other widths: no checkpoint carries them
    ],
)
def test_a_phase_that_cannot_run_is_refused_in_one_line_naming_it(capsys, overrides, says):
    phases = f"phases=[{{name:first}},{{name:second,overrides:[{overrides}]}}]"
    assert main(["experiment=smoke", phases]) == 1
    out, err = capsys.readouterr()
    assert out == "" and err.count("\n") == 1
    assert err.startswith("trainflow.plan: phase second: ") and says in err


def test_a_phase_named_on_the_command_line_is_planned_alone(capsys):
    assert main([CAMPAIGN, "phase=long_context", "--json"]) == 0
    plan = json.loads(capsys.readouterr().out)
    assert "phases" not in plan and plan["setup"]["layout"]["cp"] == 16 and plan["campaign"]["steps"] == 12_000
