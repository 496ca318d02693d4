"""Composing a stage's config with Hydra's compose API, and Hydra's errors as one line.

python -c "from trainflow.config import compose; print(compose('train_segment', ['model=tiny']))"
"""

from __future__ import annotations

import dataclasses
import logging.config
import re
import shlex
from pathlib import Path

import yaml
from hydra.core.override_parser.overrides_parser import OverridesParser
from hydra.core.override_parser.types import Override
from hydra.errors import HydraException
from omegaconf import DictConfig, OmegaConf
from omegaconf.errors import ConfigAttributeError, ConfigKeyError, OmegaConfBaseException

from trainflow.config.checks import validate
from trainflow.config.keys import refuse_unknown_keys, unknown_key
from trainflow.config.run_folder import fill_io
from trainflow.config.schema import TrainflowConfig
from trainflow.errors import ConfigError

# conf/ lives at the repository root; trainflow is installed editable (`pip install -e .`).
CONF_DIR = Path(__file__).resolve().parents[3] / "conf"


def compose(config_name: str, overrides: list[str] | tuple[str, ...] = ()) -> TrainflowConfig:
    """Compose a primary config with Hydra's compose API, resolve it and validate it."""
    return to_config(compose_raw(config_name, overrides))


def compose_raw(config_name: str, overrides: list[str] | tuple[str, ...] = ()) -> DictConfig:
    """A primary config as Hydra composes it, before to_config: every error in one ConfigError line."""
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
        raise ConfigError(one_line(err)) from err
    return raw


def job_logging() -> None:
    """The stages' log lines (conf/hydra/job_logging/trainflow.yaml) in a process that composes its config itself."""
    logging.config.dictConfig(yaml.safe_load((CONF_DIR / "hydra/job_logging/trainflow.yaml").read_text()))


def parse_override(word: str, what: str = "override") -> Override:
    """One Hydra override parsed, or one line naming it and the fix: most words that do not parse hold a character
    Hydra's grammar keeps for itself (`;`, `(`, a space, a quote) in a value that wants quoting."""
    try:
        return OverridesParser.create().parse_override(word)
    except HydraException as err:
        reason = " ".join(str(err).split()).split(" expecting ")[0]  # the parser's list of tokens is noise
    key, eq, value = word.partition("=")
    value = value.strip("'\"")
    quoted = f"{key}='{value}'" if "'" not in value else f'{key}="{value}"'
    shell = f'"{quoted}"' if not re.search(r'["$`\\!]', quoted) else shlex.quote(quoted)
    fix = f"quote the value for Hydra, e.g. {shell} on a shell" if eq else f"give key=value, e.g. {word}=..."
    raise ConfigError(f"{what} {word!r} does not parse ({reason}): {fix}") from None


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
