"""Context parallel (parallel.cp) beyond the golden-loss layouts of test_parity: FSDP2 over dp x cp, recompute, windows
inside one document, checkpoints between cp2 and one process, and the gate's cp pattern."""

from __future__ import annotations

import pytest

from tests.conftest import GOLDEN_RTOL, assert_resumes_bitwise, make_config, read_json, run_segment, step_losses
from trainflow.stages import validate_nccl

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


@pytest.mark.slow  # one 4-rank gate job
def test_the_gate_times_the_cp_all_gather_and_the_gradients_group(tmp_path):
    """dp2_cp2: K and V are gathered on the two cp groups of 2; gradients are all-reduced on one group of dp x cp."""
    small = ("cluster.gate.sweep_mb=[1.0]", "cluster.gate.sweep_iters=2", "train.global_batch=8")
    cfg = make_config("validate_nccl", tmp_path, "parallel=dp2_cp2", *small)
    validate_nccl.run(cfg)
    table = {row["pattern"]: row for row in read_json(cfg.io.nccl_report)["patterns"]}
    assert set(table) == {"dp_all_reduce", "cp_all_gather"}
    assert (table["cp_all_gather"]["groups"], table["cp_all_gather"]["group_size"]) == (2, 2)
    assert (table["dp_all_reduce"]["groups"], table["dp_all_reduce"]["group_size"]) == (1, 4)
    assert all(row["busbw_gbps"] > 0 and row["passed"] for row in table.values())
