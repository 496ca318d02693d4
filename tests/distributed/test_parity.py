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

STEPS = 10
# (preset, segments): the 3-D layout trains 2 segments of 5 steps, so its second half resumes
# from a checkpoint it wrote itself (DCP shards of 8 ranks).
LAYOUTS = [
    ("single", 1),
    ("dp2", 1),
    ("tp2", 1),
    ("pp2_gpipe", 1),
    ("pp2_1f1b", 1),
    ("pp2_interleaved", 1),
    ("tp2_pp2", 1),
    ("dp2_tp2", 1),  # GradReducer overlapped with backward, on DTensor gradients
    ("dp2_tp2_pp2", 2),
    # Sharded data parallel (FSDP2): alone, with TP, with PP, and all three resuming from its own checkpoint.
    ("dp2_shard", 1),
    pytest.param("dp2_shard_tp2", 1, marks=pytest.mark.slow),
    pytest.param("dp2_shard_pp2", 1, marks=pytest.mark.slow),
    ("dp2_shard_tp2_pp2", 2),
]


def layout_name(entry) -> str:
    return getattr(entry, "values", entry)[0]  # a pytest.param or a plain (name, segments)


@pytest.mark.parametrize(("layout", "segments"), LAYOUTS, ids=[layout_name(e) for e in LAYOUTS])
def test_losses_match_one_process(layout, segments, tmp_path, fixed_tokens):
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


def test_sharded_data_parallel_resumes_bitwise(tmp_path, fixed_tokens):
    """FSDP2 on 2 ranks: every rank's shards of the model and AdamW state survive a checkpoint bit for bit."""
    assert_resumes_bitwise(
        tmp_path, fixed_tokens, "parallel=dp2_shard", "train.global_batch=8", "checkpoint.interval_steps=100"
    )
