"""The schema's keys: a composed config may hold no key outside them, however it came (an override, `+`, `++`, a
preset, an experiment), and a mistyped one is named in one line with the closest key the schema has.

    python -c "from trainflow.config import compose; compose('train_segment', ['+optim.lrr=1e-3'])"

Hydra refuses `optim.lrr=1e-3` itself, but `+` and `++` add the key to the structured config (`open_dict`), and
OmegaConf.to_object then drops it without a word: the run would go on with optim.lr's default and an unchanged hash.
Dict fields (cluster.runtime.env, gate.busbw_gbps, ...) are open: their keys are the user's.
"""

from __future__ import annotations

import dataclasses
import difflib
import typing

from omegaconf import DictConfig, ListConfig, OmegaConf
from omegaconf.errors import ConfigAttributeError, ConfigKeyError

from trainflow.config.resilience import MOVED
from trainflow.config.schema import TrainflowConfig
from trainflow.errors import ConfigError

SCHEMA_FILE = "src/trainflow/config/schema.py"


def schema_keys(cls: type = TrainflowConfig, prefix: str = "") -> list[str]:
    """Every dotted key the schema declares (sections and fields; not the keys of a dict field or list item)."""
    keys = []
    for name, kind in typing.get_type_hints(cls).items():
        keys.append(prefix + name)
        if dataclasses.is_dataclass(kind):
            keys += schema_keys(kind, f"{prefix}{name}.")
    return keys


def unknown_key(full_key: str, owner: type) -> str:
    """The one line for a key `owner` (a schema dataclass) has no field for, with the closest key to give instead."""
    parent, _, name = full_key.rpartition(".")
    fields = [f.name for f in dataclasses.fields(owner)]
    head = f"unknown config key '{full_key}' ({owner.__name__} has no field '{name}')"
    if full_key in MOVED:
        return f"{head}: it is '{MOVED[full_key]}' now (config.resilience)"
    if close := difflib.get_close_matches(name, fields, n=1):
        return f"{head}: did you mean '{parent + '.' if parent else ''}{close[0]}'?"
    if close := difflib.get_close_matches(full_key, schema_keys(), n=1):
        return f"{head}: did you mean '{close[0]}'?"
    return f"{head}: its fields are {', '.join(fields)} ({SCHEMA_FILE})"


def open_dicts(cls: type = TrainflowConfig, prefix: str = "") -> list[str]:
    """The dotted keys of the schema's dict fields, whose keys are the user's (cluster.runtime.env, ...)."""
    found = []
    for name, kind in typing.get_type_hints(cls).items():
        if dataclasses.is_dataclass(kind):
            found += open_dicts(kind, f"{prefix}{name}.")
        elif typing.get_origin(kind) is dict:
            found.append(prefix + name)
    return found


def new_key(err: BaseException, overrides: list[str] | tuple[str, ...]) -> str | None:
    """The one line for an override that sets a key an open dict does not hold yet (Hydra's "not in struct"), with
    the override that adds it: the same with a leading +. None for any other error."""
    cause: BaseException | None = err
    while cause is not None and not isinstance(cause, ConfigAttributeError | ConfigKeyError):
        cause = cause.__cause__ or cause.__context__
    full_key = getattr(cause, "full_key", "") or ""
    parent = full_key.rpartition(".")[0]
    word = next((w for w in overrides if w.partition("=")[0] == full_key), None)
    if word is None or parent not in open_dicts() or "not in struct" not in str(cause):
        return None
    return (
        f"{word!r} sets {full_key.rpartition('.')[2]}, a key {parent} (an open dict) does not hold yet: add it with a "
        f"leading +, +{word}"
    )


def refuse_unknown_keys(node: DictConfig | ListConfig, path: str = "") -> None:
    """Raise ConfigError for the first key of a composed config that its schema dataclass has no field for."""
    if isinstance(node, ListConfig):
        for i in range(len(node)):
            if isinstance(item := node._get_node(i), DictConfig | ListConfig) and not item._is_none():
                refuse_unknown_keys(item, f"{path}[{i}]")
        return
    owner = OmegaConf.get_type(node)
    fields = {f.name for f in dataclasses.fields(owner)} if dataclasses.is_dataclass(owner) else None
    for key in node.keys():
        full_key = f"{path}.{key}" if path else str(key)
        if fields is not None and key not in fields:
            raise ConfigError(unknown_key(full_key, owner))
        child = node._get_node(key)
        if isinstance(child, DictConfig | ListConfig) and not child._is_none() and not child._is_missing():
            refuse_unknown_keys(child, full_key)
