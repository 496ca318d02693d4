"""A head tied to the embedding (model.tie_embeddings) trains under a pipeline as in one process: the first and
last stage's copies are summed each step (trainflow.parallel.pipeline), the gradient norm counts the weight once."""

from __future__ import annotations

import pytest

from tests.conftest import GOLDEN_RTOL, run_segment, step_losses

STEPS = 6


@pytest.mark.parametrize("layout", ["tp2_pp2"])
def test_a_tied_head_trains_across_the_pipeline_as_in_one_process(layout, tmp_path, fixed_tokens):
    run = ("model.tie_embeddings=true", "train.global_batch=8", f"train.segment_steps={STEPS}")
    one = run_segment(tmp_path / "single", fixed_tokens, "parallel=single", *run)
    split = run_segment(tmp_path / layout, fixed_tokens, f"parallel={layout}", *run)
    assert split["setup"]["parameters"] == one["setup"]["parameters"]  # the whole model, the tied weight once
    for a, b in zip(step_losses(split), step_losses(one), strict=True):
        assert a == pytest.approx(b, rel=GOLDEN_RTOL)
    norms = [[r["grad_norm"] for r in s["steps"]] for s in (split, one)]
    assert norms[0] == pytest.approx(norms[1], rel=1e-4)  # the copy's gradient is not counted twice
