"""Composing a stage's config with Hydra's compose API, and Hydra's errors as one line.

python -c "from trainflow.config import compose; print(compose('train_segment', ['model=tiny']))"
"""

from __future__ import annotations

import dataclasses
import logging.config
import re

import yaml
from omegaconf import DictConfig, OmegaConf
from omegaconf.errors import ConfigAttributeError, ConfigKeyError, OmegaConfBaseException

from trainflow.config.checks import validate
from trainflow.config.keys import new_key, refuse_unknown_keys, unknown_key
from trainflow.config.override_words import CONF_DIR, parse_override
from trainflow.config.run_folder import fill_io
from trainflow.config.schema import TrainflowConfig
from trainflow.errors import ConfigError


def compose(config_name: str, overrides: list[str] | tuple[str, ...] = ()) -> TrainflowConfig:
    """Compose a primary config with Hydra's compose API (the phase it names: config.phases), resolve it and
    validate it."""
    return to_config(compose_raw(config_name, overrides))


def compose_raw(config_name: str, overrides: list[str] | tuple[str, ...] = ()) -> DictConfig:
    """A primary config as Hydra composes it, with the phase it names (config.phases), before to_config: every error
    in one ConfigError line."""
    raw = hydra_compose_raw(config_name, overrides)
    if raw.get("phases"):
        from trainflow.config.phases import compose_phase

        return compose_phase(config_name, overrides, raw, hydra_compose_raw)
    if raw.get("phase"):
        raise ConfigError(f"phase({raw.phase!r}) but the config lists no phases: leave phase= out, or list phases")
    return raw


def hydra_compose_raw(config_name: str, overrides: list[str] | tuple[str, ...] = ()) -> DictConfig:
    """A primary config as Hydra composes it: every error in one ConfigError line."""
    from hydra import compose as hydra_compose
    from hydra import initialize_config_dir
    from hydra.core.global_hydra import GlobalHydra

    for word in overrides:
        parse_override(word)
    GlobalHydra.instance().clear()
    try:
        with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
            raw = hydra_compose(config_name=config_name, overrides=list(overrides))
    except Exception as err:  # Hydra's errors span lines; ours are one line with the fix
        raise ConfigError(new_key(err, overrides) or one_line(err)) from err
    return raw


def job_logging() -> None:
    """The stages' log lines (conf/hydra/job_logging/trainflow.yaml) in a process that composes its config itself."""
    logging.config.dictConfig(yaml.safe_load((CONF_DIR / "hydra/job_logging/trainflow.yaml").read_text()))


def one_line(err: BaseException) -> str:
    """Hydra/OmegaConf composition errors as one line: the innermost cause names the key."""
    if unknown := unknown_in(err):
        return unknown
    cause = err
    while cause.__cause__ is not None:
        cause = cause.__cause__
    text = str(cause)
    if m := re.search(
        r"Could not find '(.+?)'\s+Available options in '(.+?)':((?:\s+\S+)+?)\s+Config search path", text
    ):
        return f"no config option '{m[1]}': choose one of {', '.join(m[3].split())} for {m[2]}"
    if m := re.search(r"(Value .+?)\s+full_key: (\S+)", text):
        return f"bad value for '{m[2]}': {m[1]}"
    if m := re.search(r"full_key: (\S+)", text):
        return f"bad value for '{m[1]}': {text.splitlines()[0]}"
    return " ".join(text.split())


def unknown_in(err: BaseException) -> str | None:
    """The unknown-key line of a composition error, if a key outside the schema caused it (a preset's comes as
    the context of Hydra's error, not its cause)."""
    cause: BaseException | None = err
    while cause is not None:
        owner = getattr(cause, "object_type", None)
        if isinstance(cause, ConfigAttributeError | ConfigKeyError) and dataclasses.is_dataclass(owner):
            preset = re.match(r"In '([\w/]+)': ", str(err))
            return unknown_key(cause.full_key, owner) + (f" (set in conf/{preset[1]}.yaml)" if preset else "")
        cause = cause.__cause__ or cause.__context__
    return None


def to_config(raw: DictConfig) -> TrainflowConfig:
    """Resolve interpolations, turn the DictConfig into the dataclass tree, fill in the io paths left
    empty and validate it."""
    raw = OmegaConf.masked_copy(raw, [k for k in raw if k != "hydra"]) if "hydra" in raw else raw
    refuse_unknown_keys(raw)  # to_object would drop them: a `+optim.lrr=1e-3` would run with optim.lr's default
    try:
        OmegaConf.resolve(raw)
        cfg = OmegaConf.to_object(raw)
    except OmegaConfBaseException as err:  # an interpolation that resolves to a wrong type or nothing
        raise ConfigError(one_line(err)) from err
    assert isinstance(cfg, TrainflowConfig)
    fill_io(cfg)
    validate(cfg)
    return cfg
