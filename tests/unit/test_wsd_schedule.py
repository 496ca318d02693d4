"""Warmup-stable-decay (optim.schedule=wsd, config.schedule): warmup, lr held, then a linear or 1-sqrt decay over the
last decay_steps steps; a new horizon before the decay changes no trained step's learning rate, one inside it bends
the decay without a jump; a decay phase started from a stable checkpoint decays from lr; a manifest written before
wsd reads as the cosine it was; a decay with cosine, or an unknown schedule, is refused in one line."""

from __future__ import annotations

import json

import pytest

from trainflow.checkpoint.manifest import Manifest
from trainflow.config import ConfigError, compose
from trainflow.config.schedule import Schedule
from trainflow.config.schema import DecayShape, LrSchedule

# Dyadic settings: every value below is exact in binary floating point, so the expectations are exact too.
EXACT = ("optim.lr=1.0", "optim.min_lr_ratio=0.5", "optim.warmup_steps=8", "optim.schedule=wsd")
COSINE = "optim.schedule=cosine"  # the default campaign's first phase is wsd (conf/experiment/campaign.yaml)


def optim(*overrides: str):
    return compose("train_segment", [*EXACT, *overrides]).optim


@pytest.mark.parametrize(
    ("shape", "at_152", "at_172"),
    [("linear", 0.875, 0.71875), ("1-sqrt", 0.75, 0.625)],  # progress 1/4 and 9/16 of the decay from step 136
)
def test_wsd_warms_up_holds_then_decays_by_its_shape(shape, at_152, at_172):
    s = Schedule.of(optim("optim.decay_steps=64", f"optim.decay_shape={shape}"), horizon=200)
    assert (s.kind, s.decay_shape, s.anchor_step) == (LrSchedule.WSD, DecayShape(shape), 136)
    assert [s.lr_at(step) for step in (0, 3, 7)] == [0.125, 0.5, 1.0]  # warmup as cosine's
    assert all(s.lr_at(step) == 1.0 for step in range(8, 137))  # stable, and the decay's first step is lr
    assert (s.lr_at(152), s.lr_at(172)) == (at_152, at_172)
    assert s.lr_at(200) == s.lr_at(250) == 0.5  # lr x min_lr_ratio at the horizon, and after it
    lrs = [s.lr_at(step) for step in range(136, 201)]
    assert all(a > b for a, b in zip(lrs, lrs[1:]))


def test_without_decay_steps_wsd_holds_lr_to_the_horizon_and_past_it():
    s = Schedule.of(optim(), horizon=200)
    assert all(s.lr_at(step) == 1.0 for step in range(8, 400))
    assert s.line() == "wsd: warmup 8, stable 1, no decay"


def test_the_decay_starts_no_earlier_than_warmup_ends():
    s = Schedule.of(optim("optim.decay_steps=500", "optim.decay_shape=linear"), horizon=200)
    assert s.anchor_step == 8 and s.lr_at(7) == s.lr_at(8) == 1.0 and s.lr_at(200) == 0.5


@pytest.mark.parametrize("decay", ["optim.decay_steps=0", "optim.decay_steps=64"])
def test_a_new_horizon_before_the_decay_changes_no_trained_step(decay):
    o = optim(decay)
    before = Schedule.of(o, horizon=200)
    for horizon in (400, 150):  # extended, or shortened to a decay that still starts after step 80
        after = before.resumed(o, horizon=horizon, at=80)
        assert [after.lr_at(s) for s in range(80)] == [before.lr_at(s) for s in range(80)]  # == on floats: bitwise
        assert after == Schedule.of(o, horizon=horizon) and after.lr_at(80) == 1.0
    assert before.resumed(o, horizon=200, at=80) is before  # nothing changed: it goes on as it was


def test_a_new_horizon_inside_the_decay_bends_it_without_a_jump():
    o = optim("optim.decay_steps=64")
    before = Schedule.of(o, horizon=200)
    after = before.resumed(o, horizon=300, at=152)  # a quarter into the decay
    assert after.lr_at(152) == before.lr_at(152) == 0.75 and after.anchor_step == 152
    assert after.lr_at(300) == after.lr_at(320) == 0.5  # the same end, at the new horizon
    lrs = [after.lr_at(step) for step in range(152, 301)]
    assert all(a > b for a, b in zip(lrs, lrs[1:]))
    assert after.line() == "wsd: warmup 8, peak 1, 1-sqrt decay from 0.75 at step 152 to 0.5 at step 300"
    cut = Schedule.of(o, horizon=400).resumed(o, horizon=200, at=150)  # shortened past the stable step it reached
    assert cut.lr_at(150) == 1.0 and cut.lr_at(200) == 0.5 and cut.anchor_step == 150


def test_a_decay_phase_decays_from_the_stable_checkpoint_it_starts_at():
    stable = Schedule.of(compose("train_segment", ["optim.schedule=wsd"]).optim, horizon=1200)
    phase = compose("train_segment", ["optim.schedule=wsd", "optim.decay_steps=300"]).optim
    decay = stable.resumed(phase, horizon=1500, at=1200)
    assert decay == Schedule.of(phase, horizon=1500) and decay.anchor_step == 1200
    assert decay.lr_at(1200) == stable.lr_at(1199) == phase.lr  # no jump
    assert decay.lr_at(1500) == phase.lr * phase.min_lr_ratio
    assert decay.line() == "wsd: warmup 20, stable 0.003 to step 1200, 1-sqrt decay to 0.0003 at step 1500"


def test_cosine_ignores_the_decay_shape_it_does_not_have():
    o = compose("train_segment", [COSINE]).optim
    bent = Schedule.of(o, horizon=300).resumed(o, horizon=450, at=150)  # a re-anchored cosine
    assert (
        bent.resumed(compose("train_segment", [COSINE, "optim.decay_shape=linear"]).optim, horizon=450, at=200) is bent
    )


def test_a_schedule_written_before_wsd_reads_as_cosine():
    o = compose("train_segment", [COSINE]).optim
    plain = Schedule.of(o, horizon=300)
    old = {k: v for k, v in plain.to_json().items() if k not in ("format", "kind", "decay_steps", "decay_shape")}
    manifest = {"format": 2, "algorithm": "crc32c", "world_size": 1, "file_count": 0, "files": {}, "schedule": old}
    read = Manifest.from_json(manifest).schedule
    assert read == plain and read.kind == LrSchedule.COSINE and read.resumed(o, horizon=300, at=150) is read
    written = json.loads(json.dumps(Manifest.from_json(manifest).to_json()))
    assert written["format"] == 3 and written["schedule"]["kind"] == "cosine"
    assert Manifest.from_json(written).schedule == plain


@pytest.mark.parametrize(
    ("overrides", "fragment"),
    [
        (
            [COSINE, "optim.decay_steps=300"],
            "optim.decay_steps(300) is set but optim.schedule is cosine, whose decay spans the whole run; set "
            "optim.schedule=wsd for a decay over the last decay_steps steps, or optim.decay_steps=0",
        ),
        (["optim.schedule=bogus"], "optim.schedule('bogus') must be one of cosine, wsd"),
        (["optim.schedule=wsd", "optim.decay_shape=cubic"], "optim.decay_shape('cubic') must be one of linear, 1-sqrt"),
    ],
)
def test_a_bad_schedule_is_refused_in_one_line(overrides, fragment):
    with pytest.raises(ConfigError) as err:
        compose("train_segment", overrides)
    assert fragment in str(err.value) and "\n" not in str(err.value), str(err.value)
