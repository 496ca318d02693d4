"""Composing a stage's config with Hydra's compose API, and Hydra's errors as one line.

python -c "from trainflow.config import compose; print(compose('train_segment', ['model=tiny']))"
"""

from __future__ import annotations

import dataclasses
import logging.config
import re
import shlex
from collections.abc import Iterator
from pathlib import Path

import yaml
from hydra.core.override_parser.overrides_parser import OverridesParser
from hydra.core.override_parser.types import Override
from hydra.errors import HydraException
from omegaconf import DictConfig, OmegaConf
from omegaconf.errors import ConfigAttributeError, ConfigKeyError, OmegaConfBaseException

from trainflow.config.checks import validate
from trainflow.config.keys import new_key, refuse_unknown_keys, unknown_key
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
        raise ConfigError(new_key(err, overrides) or one_line(err)) from err
    return raw


def job_logging() -> None:
    """The stages' log lines (conf/hydra/job_logging/trainflow.yaml) in a process that composes its config itself."""
    logging.config.dictConfig(yaml.safe_load((CONF_DIR / "hydra/job_logging/trainflow.yaml").read_text()))


def parse_override(word: str, what: str = "override", *, shell: bool = True) -> Override:
    """One Hydra override parsed, or one line naming it and the fix: most words that do not parse hold a character
    Hydra's grammar keeps for itself (`;`, `(`, a space, a quote) in a value that wants quoting, or open a list or
    dict they do not close. `shell`: the fix is for a shell's command line; else for the string of
    `--config overrides="..."`, which quotes each value once (config.overrides.split)."""
    try:
        return OverridesParser.create().parse_override(word)
    except HydraException as err:
        reason = " ".join(str(err).split()).split(" expecting ")[0]  # the parser's list of tokens is noise
    key, eq, value = word.partition("=")
    if eq and (closers := unclosed(value)):  # quoting it would make a list a string: close it instead
        closed = f"{key}={value}{closers}"
        fix = f"close what its value opens, e.g. {shell_quoted(closed) if shell else closed}"
    elif eq:
        value = value.strip("'\"")
        quoted = f"{key}='{value}'" if "'" not in value else f'{key}="{value}"'
        if not shell:
            fix = f'quote the value once inside overrides="...", e.g. {quoted}'
        else:
            fix = f"quote the value for Hydra, e.g. {shell_quoted(quoted)} on a shell"
    else:
        fix = f"give key=value, e.g. {word}=..."
    raise ConfigError(f"{what} {word!r} does not parse ({reason}): {fix}") from None


def shell_quoted(text: str) -> str:
    """`text` as one word of a shell's command line, in double quotes where they keep it as it stands."""
    return f'"{text}"' if not re.search(r'["$`\\!]', text) else shlex.quote(text)


def unclosed(value: str) -> str:
    """The brackets a value opens and leaves open (outside quotes), as the closers that would close them: "]}" for
    "[{a: 1"; "" where it closes all it opens (or closes one it never opened: then it is no list to complete)."""
    opened = []
    for char in outside_quotes(value):
        if char in "[{":
            opened.append("]" if char == "[" else "}")
        elif char in "]}":
            if not opened or opened.pop() != char:
                return ""
    return "".join(reversed(opened))


def outside_quotes(text: str) -> Iterator[str]:
    """The characters of `text` outside '...' and "..." (the quotes themselves left out)."""
    quote = ""
    for char in text:
        if quote:
            quote = "" if char == quote else quote
        elif char in "'\"":
            quote = char
        else:
            yield char


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
