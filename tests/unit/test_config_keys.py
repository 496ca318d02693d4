"""A key outside the schema is refused after composition however it came (a plain override, `+`, `++`, a preset, an
experiment), in one line with the closest key; the dict fields stay open; an override that does not parse says to
quote its value, and the quoting it proposes parses."""

from __future__ import annotations

import shlex
import shutil
import sys

import pytest

from trainflow.config import CONF_DIR, ConfigError, compose, config_hash
from trainflow.config.overrides import compose_workflow

COMPOSE_MODULE = sys.modules["trainflow.config.compose"]  # the package's `compose` is the function


@pytest.mark.parametrize(
    ("override", "fragment"),
    [
        (
            "+optim.lrr=1e-3",
            "unknown config key 'optim.lrr' (OptimConfig has no field 'lrr'): did you mean 'optim.lr'?",
        ),
        (
            "++optim.lrr=1e-3",
            "unknown config key 'optim.lrr' (OptimConfig has no field 'lrr'): did you mean 'optim.lr'?",
        ),
        ("+model.n_layr=2", "unknown config key 'model.n_layr' (ModelConfig has no field 'n_layr'): did you mean "),
        ("+train.spike.windw=5", "unknown config key 'train.spike.windw' (SpikeConfig has no field 'windw')"),
        ("checkpoint.mde=x", "unknown config key 'checkpoint.mde' (CheckpointConfig has no field 'mde'): did you mean"),
        ("+train.windw=5", "did you mean 'train.spike.window'?"),  # no close field at its level: the closest key
        ("+optim.extra.a=1", "unknown config key 'optim.extra' (OptimConfig has no field 'extra')"),
        ("+zzzz=1", "TrainflowConfig has no field 'zzzz'): its fields are run, stage, "),
        ("cluster.allocation.max_restarts=5", "has no field 'max_restarts'): it is 'resilience.max_restarts' now"),
        ("train.spike.max_rollbacks=1", "has no field 'max_rollbacks'): it is 'resilience.max_rollbacks' now"),
    ],
)
def test_a_key_outside_the_schema_is_refused_with_the_closest_one(override, fragment):
    with pytest.raises(ConfigError) as err:
        compose("train_segment", [override])
    assert fragment in str(err.value) and "\n" not in str(err.value), str(err.value)


def test_an_appended_key_in_a_list_item_is_refused():
    with pytest.raises(ConfigError, match=r"'data\.sources\[1\]\.wieght' .* did you mean 'data\.sources\[1\]\.weight'"):
        compose("prepare_data", ["data=stdlib_mix", "+data.sources.1.wieght=2"])


def test_dict_fields_stay_open_to_appended_keys():
    base = compose("train_segment")
    cfg = compose(
        "train_segment", ["+cluster.runtime.env.NCCL_DEBUG=INFO", "++cluster.gate.busbw_gbps.tp_all_reduce=1"]
    )
    assert cfg.cluster.runtime.env["NCCL_DEBUG"] == "INFO" and cfg.cluster.gate.busbw_gbps["tp_all_reduce"] == 1
    assert config_hash(cfg, ("cluster",)) != config_hash(base, ("cluster",))


@pytest.mark.parametrize(
    ("name", "text"),
    [("optim/typo", "name: adamw\nlrr: 1.0e-3\n"), ("experiment/typo", "# @package _global_\noptim:\n  lrr: 1.0e-3\n")],
)
def test_a_preset_with_a_key_outside_the_schema_is_refused_naming_its_file(tmp_path, monkeypatch, name, text):
    conf = tmp_path / "conf"
    shutil.copytree(CONF_DIR, conf)
    (conf / f"{name}.yaml").write_text(text)
    monkeypatch.setattr(COMPOSE_MODULE, "CONF_DIR", conf)
    group = name.split("/")[0]
    with pytest.raises(ConfigError) as err:
        compose("train_segment", [f"{group}=typo"])
    assert str(err.value) == (
        "unknown config key 'optim.lrr' (OptimConfig has no field 'lrr'): did you mean 'optim.lr'? "
        f"(set in conf/{name}.yaml)"
    )


@pytest.mark.parametrize(
    ("word", "value"), [("data.corpus=/x/a;b.txt", "/x/a;b.txt"), ("data.corpus=/x/it's;b", "/x/it's;b")]
)
def test_an_override_that_does_not_parse_says_to_quote_it_and_the_quoting_given_works(word, value):
    """On a stage's command line the fix is a shell word; inside --config overrides="..." the override quoted once,
    as that string takes it (config.overrides.split)."""
    with pytest.raises(ConfigError) as err:
        compose("prepare_data", [word])
    message = str(err.value)
    assert "does not parse (token recognition error at:" in message and "\n" not in message, message
    fix = message.split("quote the value for Hydra, e.g. ")[1].removesuffix(" on a shell")
    assert compose("prepare_data", shlex.split(fix)).data.corpus == value
    with pytest.raises(ConfigError) as err:
        compose_workflow("default", "", shlex.quote(word))
    message = str(err.value)
    assert "does not parse (token recognition error at:" in message and "\n" not in message, message
    fix = message.split('quote the value once inside overrides="...", e.g. ')[1]
    assert compose_workflow("default", "", fix)[0].data.corpus == value


def test_an_override_without_a_value_says_to_give_one():
    with pytest.raises(ConfigError, match=r"override 'optim\.lr' does not parse \(missing EQUAL .*\): give key=value"):
        compose("train_segment", ["optim.lr"])
