"""A mixture through the real launcher: a run resumed halfway ends bitwise where an uninterrupted one does, dp2
draws the same realised mixture as one process (and trains to the same losses within the golden tolerance), and
each evaluation records every source's loss and their weighted mean."""

from __future__ import annotations

import pytest

from tests.conftest import GOLDEN_RTOL, run_segment, step_losses
from tests.support import WEIGHTS, prepare_mixture

HALF = ("train.segments=2", "train.segment_steps=3")


@pytest.fixture(scope="module")
def mixed(tmp_path_factory):
    return prepare_mixture(tmp_path_factory.mktemp("mixture"))


def test_a_mixture_resumes_bitwise_and_draws_alike_in_every_layout(mixed, tmp_path):
    tokens, sources = mixed
    one = run_segment(tmp_path / "one", tokens, "parallel=single", sources, "train.segments=1", "train.segment_steps=6")
    # resumed halfway: bitwise where the uninterrupted run ends
    halves = [
        run_segment(tmp_path / "halves", tokens, "parallel=single", sources, *HALF, f"segment={s}") for s in (0, 1)
    ]
    assert step_losses(*halves) == step_losses(one) and halves[1]["state_digest"] == one["state_digest"]
    two = run_segment(tmp_path / "two", tokens, "parallel=dp2", sources, "train.segments=1", "train.segment_steps=6")
    assert one["mixture"] == two["mixture"] and [s["name"] for s in one["mixture"]] == list(WEIGHTS)
    assert sum(s["tokens"] for s in one["mixture"]) == 6 * 4 * 128  # 6 steps of the smoke batch of 4 x 128
    for a, b in zip(step_losses(one), step_losses(two)):
        assert abs(a - b) <= GOLDEN_RTOL * abs(b)
    for e in one["evals"]:
        assert sorted(e["sources"]) == sorted(WEIGHTS)
        weighted = sum(WEIGHTS[n] * loss for n, loss in e["sources"].items()) / sum(WEIGHTS.values())
        assert e["val_loss"] == pytest.approx(weighted, rel=1e-12)
