"""Every parallel layout trains like one process: the losses of 10 steps match golden files.

Each layout runs through the real launcher (submitit's LocalExecutor, one process per rank, gloo),
fp32, deterministic. The golden file holds the single-process run's `step loss` lines; regenerate
it with `TRAINFLOW_REGEN_GOLDEN=1 pytest tests/distributed -k single` after a deliberate change
to the model, data or optimiser.
"""

from __future__ import annotations

import os

import pytest

from tests.conftest import REPO, make_config, read_json
from trainflow.stages import train_segment

GOLDEN = REPO / "tests/assets/golden/losses_10_steps.txt"
STEPS = 10
RTOL = 1e-5
# (preset, segments): the 3-D layout trains 2 segments of 5 steps, so its second half resumes
# from a checkpoint it wrote itself (DCP shards of 8 ranks).
LAYOUTS = [("single", 1), ("dp2", 1), ("tp2", 1), ("pp2_gpipe", 1), ("pp2_1f1b", 1), ("pp2_interleaved", 1),
           ("tp2_pp2", 1), ("dp2_tp2_pp2", 2)]


def train_losses(layout: str, segments: int, root, tokens) -> list[float]:
    losses = []
    for segment in range(segments):
        cfg = make_config(
            "train_segment", root, f"parallel={layout}", "train.global_batch=8", f"train.segments={segments}",
            f"train.segment_steps={STEPS // segments}", "checkpoint.interval_steps=100", f"segment={segment}",
            tokens=tokens,
        )
        train_segment.run(cfg)
        losses += [r["loss"] for r in read_json(cfg.io.segment_report)["steps"]]
    return losses


def read_golden() -> list[float]:
    if not GOLDEN.exists():
        pytest.fail(f"{GOLDEN} is missing: create it with TRAINFLOW_REGEN_GOLDEN=1 pytest tests/distributed -k single")
    return [float(line.split()[1]) for line in GOLDEN.read_text().splitlines()]


@pytest.mark.parametrize(("layout", "segments"), LAYOUTS, ids=[name for name, _ in LAYOUTS])
def test_losses_match_one_process(layout, segments, tmp_path, fixed_tokens):
    losses = train_losses(layout, segments, tmp_path, fixed_tokens)
    assert len(losses) == STEPS
    if layout == "single" and os.environ.get("TRAINFLOW_REGEN_GOLDEN"):
        GOLDEN.write_text("".join(f"{step} {loss!r}\n" for step, loss in enumerate(losses)))
    golden = read_golden()
    worst = max(abs(a - b) / abs(b) for a, b in zip(losses, golden))
    assert worst <= RTOL, (
        f"{layout}: losses differ from {GOLDEN.name} by up to {worst:.2e} (relative, allowed {RTOL:.0e}): "
        f"{losses} vs {golden}. If the single-process run changed on purpose, delete the golden file and rerun "
        "with TRAINFLOW_REGEN_GOLDEN=1 -k single"
    )
    assert losses[-1] < losses[0]  # and it learns
