"""Resume in a different layout: DCP reshards the checkpoint and the following losses still match."""

from __future__ import annotations

import pytest

from tests.conftest import make_config, read_json
from tests.distributed.test_parity import RTOL, STEPS, read_golden
from trainflow.stages import train_segment


def segment_losses(root, tokens, segment: int, *overrides: str) -> list[float]:
    cfg = make_config("train_segment", root, "train.global_batch=8", "train.segments=2", f"train.segment_steps={STEPS // 2}",
                      "checkpoint.interval_steps=100", f"segment={segment}", *overrides, tokens=tokens)
    train_segment.run(cfg)
    return [r["loss"] for r in read_json(cfg.io.segment_report)["steps"]]


@pytest.mark.parametrize(("first", "second"), [
    (["parallel=tp2"], ["parallel=pp2_1f1b"]),
    pytest.param(["parallel=dp2_tp2_pp2"], ["parallel=tp2", "parallel.dp=4", "parallel.name=dp4_tp2"], marks=pytest.mark.slow),
], ids=["tp2-to-pp2", "dp2_tp2_pp2-to-dp4_tp2"])
def test_resume_in_another_layout(tmp_path, fixed_tokens, first, second):
    losses = segment_losses(tmp_path / "a", fixed_tokens, 0, *first)
    losses += segment_losses(tmp_path / "b", fixed_tokens, 1, *second,
                             f"io.resume_from={tmp_path / 'a/capacity/checkpoints'}")
    golden = read_golden()
    worst = max(abs(a - b) / abs(b) for a, b in zip(losses, golden))
    assert len(losses) == STEPS and worst <= RTOL, (worst, losses, golden)
