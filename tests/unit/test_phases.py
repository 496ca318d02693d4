"""A campaign's phases as composed (trainflow.config.phases, docs/phases.md): which series each trains, what starts a
new one, and each bad phase refused in one line before anything runs."""

from __future__ import annotations

import pytest

from tests.conftest import make_config
from trainflow.campaign.segments import start_point
from trainflow.config import ConfigError, compose
from trainflow.config.identity import settings

LONG = '"model.seq_len=256","model.rope_scaling=llama3","train.segments=1"'


def phases(long: str = LONG, first: str = "") -> str:
    return f"phases=[{{name:pretrain,overrides:[{first}]}},{{name:long_context,overrides:[{long}]}}]"


def series(*overrides: str) -> list[str]:
    cfg = compose("train_segment", ["experiment=smoke", *overrides, "phase=long_context"])
    return [p.series for p in cfg.phases]


def test_each_phase_trains_its_own_series_named_by_its_parent():
    cfg = compose("train_segment", ["experiment=smoke", phases(), "phase=long_context"])
    first, second = (p.series for p in cfg.phases)
    assert second.startswith(f"{first}-long_context-") and cfg.io.checkpoints.endswith(second)
    assert (cfg.model.seq_len, cfg.model.rope_scaling, cfg.train.segments) == (256, "llama3", 1)
    assert [p.segments for p in cfg.phases] == [2, 1]
    assert compose("train_segment", ["experiment=smoke", phases()]).io.checkpoints.endswith(first)  # the first's
    assert "phases" not in {k.split(".")[0] for k in settings(cfg)}  # a phase's overrides are the settings they set


def test_what_starts_a_new_series_for_a_phase_and_what_continues_it():
    base = series(phases())
    assert series(phases(LONG + ',"optim.lr=1e-3"'))[1] != base[1]  # its own definition: a new series
    assert series(phases(LONG.replace("segments=1", "segments=4")))[1] == base[1]  # extended: the same series
    assert series(phases(first='"train.segments=3"'))[0] == base[0]  # the parent extended: its series goes on...
    assert series(phases(first='"train.segments=3"'))[1] != base[1]  # ...and the phase after it starts afresh
    assert series(phases(), "optim.weight_decay=0.01") == base  # the command line's settings: every series goes on
    assert series(phases(), "train.branch_from=") == base


def test_a_phase_starts_where_its_parent_ended_and_not_before(tmp_path):
    cfg = make_config("train_segment", tmp_path, phases(), "phase=long_context")
    with pytest.raises(ConfigError) as err:
        start_point(cfg)
    assert "phase long_context starts from phase pretrain's last checkpoint, but its segment 1" in str(err.value)
    assert "train phase pretrain first (phase=pretrain)" in str(err.value)
    assert start_point(make_config("train_segment", tmp_path, phases())) is None


@pytest.mark.parametrize(
    ("bad", "message"),
    [
        (phases('"model.dim=256"'), "phase long_context: model.dim(256) but phase pretrain trains model.dim=128"),
        (phases('"model.n_layers=2"'), "no checkpoint carries that into the next phase"),
        (phases('"model.dimm=256"'), "phase long_context: unknown config key 'model.dimm'"),
        (phases('"io.checkpoints=/tmp/x"'), "sets io.checkpoints, which a phase does not choose"),
        (phases('"train.branch_from=3"'), "sets train.branch_from, which a phase does not choose"),
        (phases('"hydra.run.dir=/tmp"'), "changes Hydra itself"),
        (phases('"cluster=../../etc/x"'), "must name a preset in conf/cluster/ by its name alone"),
        (phases("\"cluster.allocation.setup=['curl x|sh']\""), "sets shell lines of the sbatch script"),
        (phases('"data.max_bytes=1000"'), "phase long_context: data.max_bytes(1000) but the campaign tokenises"),
        ("phases=[{name:a},{name:a}]", "phases name 'a' twice"),
        ("phases=[{name:Bad}]", "phases[0].name('Bad') must"),
    ],
)
def test_a_bad_phase_is_refused_in_one_line(bad, message):
    with pytest.raises(ConfigError) as err:
        compose("train_segment", ["experiment=smoke", bad, "phase=long_context" if "long" in bad else "phase="])
    assert message in str(err.value) and "\n" not in str(err.value)


def test_a_phase_the_campaign_does_not_list_is_refused_in_one_line():
    with pytest.raises(ConfigError, match=r"phase\('zz'\) is none of the campaign's phases \(pretrain, long_context\)"):
        compose("train_segment", ["experiment=smoke", phases(), "phase=zz"])
    with pytest.raises(ConfigError, match=r"phase\('zz'\) but the config lists no phases"):
        compose("train_segment", ["experiment=smoke", "phase=zz"])


def test_every_phase_of_the_default_campaign_composes():
    default = compose("train_segment")
    assert [p.name for p in default.phases] == ["pretrain", "long_context"] and default.phase == "pretrain"
    long = compose("train_segment", ["phase=long_context"])
    assert (long.model.rope_scaling, long.parallel.name, long.optim.schedule) == ("llama3", "tp2", "wsd")
