"""One Hydra override word, parsed (Hydra's grammar, its errors as one line with the fix) and checked for what a
workflow's or phase's override may do: set a value, never change Hydra, sweep, move a package, load a preset by path
or put shell lines in the sbatch script (config.overrides' docstring).

    python -c "from trainflow.config.override_words import check; check('hydra.run.dir=/tmp', 'workflow')"
"""

from __future__ import annotations

import re
import shlex
from collections.abc import Iterator
from pathlib import Path

from hydra.core.override_parser.overrides_parser import OverridesParser
from hydra.core.override_parser.types import Override
from hydra.errors import HydraException

from trainflow.errors import ConfigError

# conf/ lives at the repository root; trainflow is installed editable (`pip install -e .`).
CONF_DIR = Path(__file__).resolve().parents[3] / "conf"
GROUPS = frozenset(p.name for p in CONF_DIR.iterdir() if p.is_dir())
OPTION = r"[A-Za-z0-9_-]+"


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


def check(word: str, source: str) -> None:
    """Refuse one override that does not parse or may do more than set a value; one line naming it."""
    refuse = f"{source} override {word!r}"
    if re.search(r"[\x00-\x1f\x7f]", word):
        raise ConfigError(f"{refuse} holds a control character; give one-line values")
    if word.startswith("-"):
        raise ConfigError(f"{refuse} is a command-line flag; give key=value overrides only")
    override = parse_override(word, f"{source} override", shell=False)
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
