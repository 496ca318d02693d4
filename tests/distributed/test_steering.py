"""A campaign steered at a segment boundary, in the same series (docs/runs.md, "A campaign that lives"): another layout
trains on within the golden tolerance of the uninterrupted run; another global batch takes every sample of the
stream once; a longer campaign trains its new segment from where the last one ended."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from tests.conftest import make_config, run_segment, step_losses
from trainflow.campaign.segments import lineage

RTOL = 1e-5  # fp32: layouts reduce in other orders
BASE = ("train.global_batch=8", "train.segments=2", "train.segment_steps=3", "checkpoint.interval_steps=100")


def test_a_layout_change_at_a_segment_boundary_trains_on_like_the_old_layout(tmp_path, fixed_tokens):
    first = run_segment(tmp_path / "dp2", fixed_tokens, *BASE, "parallel=dp2", "segment=0")
    for layout in ("single", "tp2"):
        shutil.copytree(tmp_path / "dp2", tmp_path / layout)
    whole = run_segment(tmp_path / "dp2", fixed_tokens, *BASE, "parallel=dp2", "segment=1")
    for layout in ("single", "tp2"):
        moved = run_segment(tmp_path / layout, fixed_tokens, *BASE, f"parallel={layout}", "segment=1")
        for got, want in zip(step_losses(first, moved), step_losses(first, whole), strict=True):
            assert abs(got - want) <= RTOL * abs(want), (layout, got, want)
        changed = {c["change"]["key"]: c for c in moved["lineage"]["changes"]}
        assert changed["parallel.name"]["change"]["after"] == layout and changed["parallel.name"]["step"] == 3
        assert moved["lineage"]["continued_from"].endswith("@3")


def test_a_batch_ramp_takes_every_sample_of_the_stream_once(tmp_path, fixed_tokens):
    base = ("train.segments=3", "train.segment_steps=3", "checkpoint.interval_steps=100")
    segments = [
        run_segment(tmp_path, fixed_tokens, *base, f"train.global_batch={batch}", f"segment={k}")
        for k, batch in enumerate((8, 16, 8))  # a ramp, and back
    ]
    windows = [r["window"] for s in segments for r in s["steps"]]
    taken = [position for start, end in windows for position in range(start, end)]
    assert taken == list(range(3 * 8 + 3 * 16 + 3 * 8))  # none twice, none skipped
    assert [end - start for start, end in windows] == [8] * 3 + [16] * 3 + [8] * 3
    changed = [c["change"] for c in segments[1]["lineage"]["changes"] if c["change"]["key"] == "train.global_batch"]
    assert changed == [{"key": "train.global_batch", "before": 8, "after": 16}]


@pytest.mark.slow  # 30 s: five segments
def test_an_extended_campaign_trains_its_new_segment_from_the_last_ones_end(tmp_path, fixed_tokens):
    """With a learning rate that does not depend on the campaign's length, 2 segments extended by a third end bit for
    bit where 3 segments run at once end."""
    base = ("train.global_batch=8", "train.segment_steps=3", "checkpoint.interval_steps=100", "optim.min_lr_ratio=1")
    for k in (0, 1):
        run_segment(tmp_path / "extended", fixed_tokens, *base, "train.segments=2", f"segment={k}")
    extended = run_segment(tmp_path / "extended", fixed_tokens, *base, "train.segments=3", "segment=2")
    at_once = [
        run_segment(tmp_path / "at_once", fixed_tokens, *base, "train.segments=3", f"segment={k}") for k in (0, 1, 2)
    ]
    assert extended["state_digest"] == at_once[-1]["state_digest"]
    assert step_losses(extended) == step_losses(at_once[-1])
    cfg = make_config("train_segment", tmp_path / "extended", *base, "train.segments=3", tokens=fixed_tokens)
    done = lineage(cfg.io.checkpoints)
    assert [(line.start_step, line.end_step) for line in done.values()] == [(0, 3), (3, 6), (6, 9)]
    keys = {c.change.key for c in done[2].changes}
    assert "train.segments" in keys and done[2].continued_from.endswith("@6")


@pytest.mark.slow  # 15 s; a branch's refusals and records are checked in tests/unit/test_campaign.py
def test_a_branch_trains_a_new_series_from_a_checkpoint_and_leaves_the_old_one_as_it_was(tmp_path, fixed_tokens):
    main = [run_segment(tmp_path, fixed_tokens, *BASE, f"segment={k}") for k in (0, 1)]
    parent = make_config("train_segment", tmp_path, *BASE, tokens=fixed_tokens).io.checkpoints
    before = {p: p.read_bytes() for p in sorted(Path(parent).rglob("*")) if p.is_file()}
    branch = run_segment(tmp_path, fixed_tokens, *BASE, "train.branch_from=3", "optim.lr=1e-4", "segment=0")
    assert (branch["start_step"], branch["end_step"]) == (3, 6)
    assert branch["steps"][0]["loss"] == main[1]["steps"][0]["loss"]  # the parent's weights and data at step 3
    assert branch["steps"][1]["loss"] != main[1]["steps"][1]["loss"]  # then its own learning rate
    series = Path(parent).name
    assert branch["lineage"]["continued_from"] == f"{series}@3"
    assert {c["change"]["key"] for c in branch["lineage"]["changes"]} >= {"optim.lr", "lr schedule"}
    assert {p: p.read_bytes() for p in sorted(Path(parent).rglob("*")) if p.is_file()} == before
    assert (Path(parent).parent / f"{series}-b3" / "series.json").is_file()
