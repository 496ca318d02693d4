"""The training stream by global sample position (data.stream) and the schedule a checkpoint carries
(config.schedule): any batch, layout or mixture change continues the stream, none twice, none skipped; an extended
campaign's learning rate bends without a jump; an unchanged one is the plain formula bit for bit."""

from __future__ import annotations

import math

import numpy as np

from trainflow.config import compose
from trainflow.config.schedule import Schedule
from trainflow.data.mixture import assign
from trainflow.data.stream import DataStream, StreamPosition, migrated

WEIGHTS = {"web": 0.7, "code": 0.3}


def lr_at(step: int, optim, total_steps: int) -> float:
    """The schedule trainflow computed per step before it carried one (the oracle): warmup, then cosine over the whole
    campaign's steps."""
    if step < optim.warmup_steps:
        return optim.lr * (step + 1) / optim.warmup_steps
    progress = (step - optim.warmup_steps) / max(total_steps - optim.warmup_steps, 1)
    cosine = 1 + math.cos(math.pi * min(progress, 1.0))
    return optim.lr * (optim.min_lr_ratio + (1 - optim.min_lr_ratio) * 0.5 * cosine)


def stream(weights=WEIGHTS, block: int = 8) -> DataStream:
    return DataStream(StreamPosition.start(block=block, names=list(weights)), weights=weights, seed=3)


def test_a_batch_change_takes_every_position_once():
    s, taken = stream(), []
    for batch in (8, 8, 16, 16, 8, 12):  # a ramp, and back
        rows = s.take(batch)
        taken += range(rows.start, rows.end)
        assert rows.end - rows.start == batch
    assert taken == list(range(68))


def test_a_position_saved_and_restored_continues_the_same_rows():
    a = stream()
    a.take(8)
    b = DataStream(a.position, weights=WEIGHTS, seed=3)  # a resume, at any layout
    for x, y in zip([a.take(16) for _ in range(3)], [b.take(16) for _ in range(3)]):
        assert (x.start, x.end) == (y.start, y.end)
        assert np.array_equal(x.sources, y.sources) and np.array_equal(x.positions, y.positions)


def test_each_source_continues_from_its_own_position_when_the_weights_change():
    s, seen = stream(), {0: [], 1: []}
    for _ in range(5):
        rows = s.take(16)
        for k in (0, 1):
            seen[k] += rows.positions[rows.sources == k].tolist()
    reweighted = DataStream(s.position, weights={"web": 0.2, "code": 0.8}, seed=3)
    for _ in range(5):
        rows = reweighted.take(16)
        for k in (0, 1):
            seen[k] += rows.positions[rows.sources == k].tolist()
    for k in (0, 1):  # each source's samples in order, none twice, none skipped
        assert seen[k] == list(range(len(seen[k])))
    assert len(seen[1]) > 0.5 * 160 * 0.55  # the new weights took effect: code gave more than its first share


def test_skipped_ranges_use_up_their_sources_samples():
    s = stream()
    s.skip([[8, 16]])
    first, second = s.take(8), s.take(8)
    assert (first.start, second.start) == (0, 16)
    which = assign(list(WEIGHTS.values()), seed=3, start=0, count=24)
    assert second.positions.tolist() == [int((which[:n] == which[n]).sum()) for n in range(16, 24)]


def test_a_format_1_position_is_the_step_times_the_batch_past_its_skipped_windows():
    position = migrated(5, [1, 6], batch=4, weights={"corpus": 1.0}, seed=0)  # steps 0-4 drew windows 0, 2, 3, 4, 5
    assert (position.samples, position.sources, position.skipped) == (28, {"corpus": 28}, [[4, 8], [24, 28]])
    s = DataStream(position, weights={"corpus": 1.0}, seed=0)
    assert s.take(4).start == 28  # step 5 draws window 7: window 6 left out, as the release before positions drew


def test_an_unchanged_schedule_is_the_plain_formula_bit_for_bit():
    optim = compose("train_segment", ["optim.warmup_steps=5", "optim.schedule=cosine"]).optim
    schedule = Schedule.of(optim, horizon=300)
    assert all(schedule.lr_at(step) == lr_at(step, optim, 300) for step in range(320))
    assert schedule.resumed(optim, horizon=300, at=150) == schedule


def test_a_longer_campaign_bends_the_decay_from_the_step_it_reached():
    optim = compose("train_segment", ["optim.warmup_steps=5", "optim.schedule=cosine"]).optim
    before = Schedule.of(optim, horizon=300)
    after = before.resumed(optim, horizon=450, at=150)  # 1 segment of 150 done of 2, a third added
    assert after.lr_at(150) == before.lr_at(150)  # no jump
    assert after.lr_at(300) > before.lr_at(300) and after.lr_at(449) > after.lr_at(450)
    assert after.lr_at(450) == after.lr_at(500) == optim.lr * optim.min_lr_ratio  # the same end, later
    lrs = [after.lr_at(step) for step in range(150, 451)]
    assert all(a > b for a, b in zip(lrs, lrs[1:]))  # decaying all the way to the new end
    assert "to 0.0003 at step 450" in after.line() and "at step 150" in after.line()
    done = before.resumed(optim, horizon=450, at=300)  # extended once the decay had ended: it stays at its end
    assert done.lr_at(300) == done.lr_at(400) == before.lr_at(300)


def test_new_optim_settings_are_followed_from_the_segment_they_start():
    optim = compose("train_segment", []).optim
    lowered = compose("train_segment", ["optim.lr=1e-4"]).optim
    after = Schedule.of(optim, horizon=300).resumed(lowered, horizon=300, at=150)
    assert after == Schedule.of(lowered, horizon=300) and after.lr_at(150) < Schedule.of(optim, horizon=300).lr_at(150)
