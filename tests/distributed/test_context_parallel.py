"""Context parallel (parallel.cp) beyond the golden-loss layouts of test_parity: FSDP2 over dp x cp, recompute, windows
inside one document, and checkpoints between cp2 and one process."""

from __future__ import annotations

import pytest

from tests.conftest import GOLDEN_RTOL, assert_resumes_bitwise, make_config, run_segment, step_losses

STEPS = 4
RUN = ("train.global_batch=8", "checkpoint.interval_steps=100")


def assert_same_losses(a: dict, b: dict) -> None:
    for x, y in zip(step_losses(a), step_losses(b), strict=True):
        assert x == pytest.approx(y, rel=GOLDEN_RTOL)


@pytest.mark.slow  # two launcher runs, ~2 min under load
@pytest.mark.parametrize(
    "extra",
    [("train.cross_document=false",), ("train.activations=recompute",)],
    ids=["cross_document_false", "recompute"],
)
def test_cp2_trains_as_one_process(extra, tmp_path, fixed_tokens):
    """cp2 with windows inside one document, and with each block recomputed (the all-gather runs again in backward),
    gives one process's losses within 1e-5."""
    run = (*RUN, f"train.segment_steps={STEPS}", *extra)
    one = run_segment(tmp_path / "one", fixed_tokens, "parallel=single", *run)
    cp2 = run_segment(tmp_path / "cp2", fixed_tokens, "parallel=cp2", *run)
    assert_same_losses(cp2, one)


@pytest.mark.slow  # two 4-rank launcher runs
def test_fsdp_over_dp_and_cp_trains_as_one_process(tmp_path, fixed_tokens):
    """dp2_shard_cp2: FSDP2 shards over the four ranks of dp x cp, which hold one replica's data in halves."""
    run = (*RUN, f"train.segment_steps={STEPS}")
    one = run_segment(tmp_path / "one", fixed_tokens, "parallel=single", *run)
    sharded = run_segment(tmp_path / "shard", fixed_tokens, "parallel=dp2_shard_cp2", *run)
    assert_same_losses(sharded, one)


@pytest.mark.slow  # two launcher runs of 2 ranks
def test_cp2_resumes_bitwise(tmp_path, fixed_tokens):
    assert_resumes_bitwise(tmp_path, fixed_tokens, "parallel=cp2", *RUN)


@pytest.mark.slow  # three launcher runs
@pytest.mark.parametrize(("first", "second"), [("cp2", "single"), ("single", "cp2")])
def test_a_checkpoint_moves_between_cp2_and_one_process(first, second, tmp_path, fixed_tokens):
    """3 steps in one layout, 3 resumed in the other, are 6 steps of one process (within 1e-5: cp sums the softmax
    in another order, so bitwise holds only within a layout, test_cp2_resumes_bitwise)."""
    halves = (*RUN, "train.segments=2", "train.segment_steps=3")
    a = run_segment(tmp_path / "a", fixed_tokens, *halves, "segment=0", f"parallel={first}")
    checkpoints = make_config("train_segment", tmp_path / "a", *halves, f"parallel={first}", tokens=fixed_tokens)
    resume = f"io.resume_from={checkpoints.io.checkpoints}"
    b = run_segment(tmp_path / "b", fixed_tokens, *halves, "segment=1", f"parallel={second}", resume)
    whole = run_segment(tmp_path / "w", fixed_tokens, *RUN, "train.segment_steps=6", "parallel=single")
    assert step_losses(a, b) == pytest.approx(step_losses(whole), rel=GOLDEN_RTOL)
