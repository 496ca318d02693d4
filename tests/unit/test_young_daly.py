"""Young/Daly's optimal checkpoint interval: the seed's example and its square-root law."""

from __future__ import annotations

import math

from hypothesis import given
from hypothesis import strategies as st

from trainflow.checkpoint.interval import IntervalPlanner, young_daly_seconds, young_daly_steps


def test_seed_example():
    # Seed: MTBF 4 h, checkpoint 2 min -> 31 min ~= 250 iterations (at 7.44 s/iteration).
    seconds = young_daly_seconds(save_s=120, mtbf_s=4 * 3600)
    assert round(seconds) == 1859 and round(seconds / 60) == 31
    assert young_daly_steps(save_s=120, mtbf_s=4 * 3600, step_s=7.44) == 250


@given(save=st.floats(0.01, 1e4), mtbf=st.floats(60, 1e7), k=st.floats(1.1, 100))
def test_interval_grows_as_square_root(save, mtbf, k):
    base = young_daly_seconds(save_s=save, mtbf_s=mtbf)
    assert math.isclose(young_daly_seconds(save_s=save * k, mtbf_s=mtbf), base * math.sqrt(k), rel_tol=1e-9)
    assert math.isclose(young_daly_seconds(save_s=save, mtbf_s=mtbf * k), base * math.sqrt(k), rel_tol=1e-9)


def test_planner_replans_from_measurements():
    planner = IntervalPlanner(mtbf_s=4 * 3600, first_after=5)
    assert planner.interval_steps == 5  # nothing measured yet: save early to measure
    planner.observe_step(7.44)
    planner.observe_save(120)
    assert planner.interval_steps == 250
    planner.observe_save(480)  # slower saves: running mean 300 s -> interval grows by sqrt(2.5)
    assert planner.interval_steps == young_daly_steps(save_s=300, mtbf_s=4 * 3600, step_s=7.44) == 395
    assert IntervalPlanner(mtbf_s=1, fixed_steps=17).interval_steps == 17


def test_a_save_before_any_step_plans_the_first_interval_then_the_next_save_plans_young_daly():
    """A phase's opening save comes before its first step (config.phases): no step time to convert with yet. Before
    the fix the interval raised ValueError (NaN to int) and failed the default campaign's second phase once."""
    planner = IntervalPlanner(mtbf_s=3600.0)
    planner.observe_save(2.0)
    assert planner.interval_steps == planner.first_after and planner.describe().interval_steps == planner.first_after
    planner.observe_step(0.5)
    planner.observe_save(2.0)
    assert planner.interval_steps == young_daly_steps(save_s=2.0, mtbf_s=3600.0, step_s=0.5)
