"""Every parallel layout trains like one process: the losses of 10 steps match golden files.

Each layout runs through the real launcher (submitit's LocalExecutor, one process per rank, gloo),
fp32, deterministic. The golden file holds the single-process run's `step loss` lines; regenerate
it with `TRAINFLOW_REGEN_GOLDEN=1 pytest tests/distributed -k single` after a deliberate change
to the model, data or optimiser.
"""

from __future__ import annotations

import os

import pytest

from tests.conftest import GOLDEN, assert_matches_golden, assert_resumes_bitwise, run_segment, step_losses
from tests.support import LAYOUTS, STEPS, layout_name


@pytest.mark.parametrize(("layout", "segments"), LAYOUTS, ids=[layout_name(e) for e in LAYOUTS])
def test_losses_match_one_process(layout, segments, tmp_path, fixed_tokens):
    assert_layout_matches_golden(layout, segments, tmp_path, fixed_tokens)


def assert_layout_matches_golden(layout: str, segments: int, tmp_path, fixed_tokens) -> dict:
    """Train STEPS steps of `layout` in `segments` segments and compare with the golden losses; the last summary."""
    summaries = [
        run_segment(
            tmp_path,
            fixed_tokens,
            f"parallel={layout}",
            "train.global_batch=8",
            f"train.segments={segments}",
            f"train.segment_steps={STEPS // segments}",
            "checkpoint.interval_steps=100",
            f"segment={segment}",
        )
        for segment in range(segments)
    ]
    losses = step_losses(*summaries)
    assert len(losses) == STEPS
    if layout == "single" and os.environ.get("TRAINFLOW_REGEN_GOLDEN"):
        GOLDEN.write_text("".join(f"{step} {loss!r}\n" for step, loss in enumerate(losses)))
    assert_matches_golden(losses, layout)
    assert losses[-1] < losses[0]  # and it learns
    return summaries[-1]


@pytest.mark.slow  # 21 s; FSDP's own resume stays in the default suite
def test_hybrid_sharding_shards_within_groups_and_replicates_across(tmp_path, fixed_tokens):
    """HSDP (dp4_hsdp2: 2 replicas of 2-way shard groups) matches the golden losses, and its state lies as HSDP
    places it: ranks 0 and 2 (shard 0 of each replica) hold the same bytes, as do 1 and 3; 0 and 1 differ."""
    digests = assert_layout_matches_golden("dp4_hsdp2", 1, tmp_path, fixed_tokens)["state_digest"]
    assert digests[0] == digests[2] and digests[1] == digests[3]
    assert digests[0] != digests[1]


def test_sharded_data_parallel_resumes_bitwise(tmp_path, fixed_tokens):
    """FSDP2 on 2 ranks: every rank's shards of the model and AdamW state survive a checkpoint bit for bit."""
    assert_resumes_bitwise(
        tmp_path, fixed_tokens, "parallel=dp2_shard", "train.global_batch=8", "checkpoint.interval_steps=100"
    )
