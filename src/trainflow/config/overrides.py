"""The Hydra overrides a workflow is given (`--config overrides=...`, a profile's `site`): split, checked
and composed before any stage runs, so a bad or hostile string fails in one line and runs nothing.

    python -c "from trainflow.config.overrides import compose_workflow as c; print(c('default', '', 'parallel=tp2'))"

Every stage's command line repeats these overrides, so what they may do is narrower than what Hydra
allows on a command line: no flags (`--config-dir`, `-m`), no `hydra.*` keys or `hydra/` groups (Hydra
instantiates callbacks and logging handlers from them), no sweeps, no package changes, group options
by name only (`cluster=../x` would load any YAML file), and no `cluster.allocation.setup` (shell lines of the
sbatch script belong in a reviewed conf/cluster preset).
"""

from __future__ import annotations

import re
import shlex

from hydra.core.override_parser.overrides_parser import OverridesParser
from hydra.errors import HydraException

from trainflow.config.compose import CONF_DIR, compose, parse_override
from trainflow.config.domain import RUN_NAME
from trainflow.config.schema import TrainflowConfig
from trainflow.errors import ConfigError

GROUPS = frozenset(p.name for p in CONF_DIR.iterdir() if p.is_dir())
OPTION = r"[A-Za-z0-9_-]+"


def split(text: str, source: str) -> list[str]:
    """Shell-like words of an override string. Snakemake strips every quote at both ends of a --config
    value (`overrides="data.corpus='/x/*.txt'"` arrives as `data.corpus='/x/*.txt`), so a text that
    does not split into overrides Hydra parses is retried with the stripped quotes restored."""
    for candidate in (text, *(text + q for q in ("'", '"', "'\"", "\"'")), "'" + text, '"' + text):
        try:
            words = shlex.split(candidate)
        except ValueError:
            continue
        if all(map(parses, words)):
            return words
    try:
        return shlex.split(text)  # `check` names the word Hydra cannot parse
    except ValueError:
        raise ConfigError(
            f"{source}({text!r}) does not split into overrides (unbalanced quotes); quote each value once"
        ) from None


def parses(word: str) -> bool:
    try:
        OverridesParser.create().parse_override(word)
        return True
    except HydraException:
        return False


def check(word: str, source: str) -> None:
    """Refuse one override that does not parse or may do more than set a value; one line naming it."""
    refuse = f"{source} override {word!r}"
    if re.search(r"[\x00-\x1f\x7f]", word):
        raise ConfigError(f"{refuse} holds a control character; give one-line values")
    if word.startswith("-"):
        raise ConfigError(f"{refuse} is a command-line flag; give key=value overrides only")
    override = parse_override(word, f"{source} override")
    key = override.key_or_group
    if re.match(r"hydra\b", key):
        raise ConfigError(f"{refuse} changes Hydra itself; trainflow's stages take settings under their own keys")
    if override.is_sweep_override():
        raise ConfigError(f"{refuse} is a sweep; run one workflow per value instead")
    if override.package is not None:
        raise ConfigError(f"{refuse} moves a config package ('@'); set the keys themselves")
    if key in GROUPS and not (override.is_delete() or re.fullmatch(OPTION, str(override.value()))):
        raise ConfigError(f"{refuse} must name a preset in conf/{key}/ by its name alone")
    if re.fullmatch(r"cluster\.allocation\.setup(\..*)?", key):
        raise ConfigError(f"{refuse} sets shell lines of the sbatch script; put them in a conf/cluster/ preset")


WORKFLOW_KEYS = ("run", "site", "overrides")
"""workflow/config.yaml's keys, the only ones `snakemake --config` takes."""


def check_workflow_config(config: dict) -> dict[str, str]:
    """Snakemake's config (workflow/config.yaml and --config) as text, or one ConfigError line before its JSON schema
    would refuse it with a dump of the schema. An empty `site=` or `overrides=` (Snakemake reads it as None) is none."""
    if odd := sorted(set(config) - set(WORKFLOW_KEYS)):
        raise ConfigError(
            f"--config {odd[0]}=... is no workflow setting: give {', '.join(k + '=' for k in WORKFLOW_KEYS)} (Hydra "
            f'settings go inside overrides="...")'
        )
    settings = {"site": "", "overrides": ""} | {key: value for key, value in config.items() if value is not None}
    if (run := settings.get("run")) is None:
        raise ConfigError("--config run= is empty: name the run, e.g. run=lr1e3 (or leave run= out for runs/default/)")
    if not isinstance(run, str):  # --config strips quotes, then reads digits as a number and True/False as a bool
        raise ConfigError(
            f"--config run({run!r}) was read as {type(run).__name__}, not a name (Snakemake's --config drops quotes "
            f"and reads digits as a number): keep it text with --config 'run=!!str {run}' (the name as you mean it), "
            f"or name it run=r{run}"
        )
    for key in ("site", "overrides"):
        if not isinstance(value := settings[key], str):
            raise ConfigError(
                f"--config {key}({value!r}) was read as {type(value).__name__}: give Hydra overrides, e.g. "
                f'{key}="model=tiny optim.lr=1e-3"'
            )
    if not re.fullmatch(RUN_NAME, run):
        raise ConfigError(
            f"--config run({run!r}) must be a plain name (letters, digits, _ . - and no leading dot): it names the "
            "folder runs/<run>/; give e.g. run=lr1e3"
        )
    return settings


def checked_overrides(run: str, site: str, overrides: str) -> list[str]:
    """The workflow's Hydra overrides, the site's before the user's so the user's win."""
    words = [f"run={hydra_quote(run)}", *split(site, "site"), *split(overrides, "overrides")]
    for word in words:
        check(word, "run" if word == words[0] else "workflow")
    return words


def compose_workflow(run: str, site: str, overrides: str) -> tuple[TrainflowConfig, list[str]]:
    """The config the DAG is planned from (train_segment's, which reads every group) and the
    overrides every stage is given."""
    words = checked_overrides(run, site, overrides)
    return compose("train_segment", words), words


def hydra_quote(value: str | list[str]) -> str:
    """A path (or list of paths, or a run's name) as a Hydra override value taken literally: as it is when Hydra reads
    it so, else single-quoted, which config.UNSAFE_PATH_CHARS makes safe (no quote, backslash or `$`). Hydra reads
    `1e3`, `1_000`, `true` and `null` as a number, a bool or None: those are quoted too."""
    if isinstance(value, list):
        return "[" + ",".join(map(hydra_quote, value)) + "]"
    return value if re.fullmatch(r"[\w./+@%~-]+", value) and read_as_itself(value) else f"'{value}'"


def read_as_itself(value: str) -> bool:
    """Whether Hydra reads `key=<value>` as the text itself (not a number, bool or None, nor no override at all)."""
    try:
        return OverridesParser.create().parse_override(f"key={value}").value() == value
    except HydraException:
        return False
