"""Resume in a different layout: DCP reshards the checkpoint and the following losses still match."""

from __future__ import annotations

import pytest

from tests.conftest import assert_matches_golden, make_config, run_segment, step_losses

STEPS = 10
BASE = (
    "train.global_batch=8",
    "train.segments=2",
    f"train.segment_steps={STEPS // 2}",
    "checkpoint.interval_steps=100",
)


@pytest.mark.parametrize(
    ("first", "second"),
    [
        (["parallel=tp2"], ["parallel=pp2_1f1b"]),
        # tp splits the embedding and head by vocabulary row: a whole one (one process's, or replicated) splits on load.
        pytest.param(["parallel=single"], ["parallel=tp2"], marks=pytest.mark.slow),
        pytest.param(
            ["parallel=dp2_tp2_pp2"], ["parallel=tp2", "parallel.dp=4", "parallel.name=dp4_tp2"], marks=pytest.mark.slow
        ),
        # Sharded (FSDP2) and replicated data parallel save the same keys; DCP moves between them both ways.
        (["parallel=dp2_shard"], ["parallel=dp2"]),
        pytest.param(["parallel=dp2"], ["parallel=dp2_shard_tp2"], marks=pytest.mark.slow),
        pytest.param(["parallel=dp4_hsdp2"], ["parallel=dp2"], marks=pytest.mark.slow),
    ],
    ids=[
        "tp2-to-pp2",
        "single-to-tp2",
        "dp2_tp2_pp2-to-dp4_tp2",
        "dp2_shard-to-dp2",
        "dp2-to-dp2_shard_tp2",
        "dp4_hsdp2-to-dp2",
    ],
)
def test_resume_in_another_layout(tmp_path, fixed_tokens, first, second):
    a = run_segment(tmp_path / "a", fixed_tokens, *BASE, "segment=0", *first)
    checkpoints = make_config("train_segment", tmp_path / "a", *BASE, *first, tokens=fixed_tokens).io.checkpoints
    b = run_segment(tmp_path / "b", fixed_tokens, *BASE, "segment=1", *second, f"io.resume_from={checkpoints}")
    assert_matches_golden(step_losses(a, b), f"{first} -> {second}")
