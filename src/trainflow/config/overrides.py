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

from trainflow.config.compose import compose
from trainflow.config.domain import RUN_NAME
from trainflow.config.identity import series_name
from trainflow.config.override_words import check, outside_quotes
from trainflow.config.schema import TrainflowConfig
from trainflow.errors import ConfigError


def split(text: str, source: str) -> list[str]:
    """The overrides of a string (docs/configuration.md, "Quoting"): cut at spaces outside quotes and brackets, a
    value wholly in quotes taken as the text between them (words). Snakemake strips every quote at both ends of a
    --config value (`overrides="data.corpus='/x/*.txt'"` arrives as `data.corpus='/x/*.txt`), so a text that does not
    split into overrides Hydra parses is retried with the stripped quotes restored."""
    ends = ("'", '"', "'\"", "\"'")
    for candidate in (
        text,
        *(text + q for q in ends),
        *(q + text for q in ends[:2]),
        *(q + text + q for q in ends[:2]),
    ):
        try:
            found = words(candidate)
        except ValueError:
            continue
        if all(map(parses, found)):
            return found
    try:
        return words(text)  # `check` names the word Hydra cannot parse
    except ValueError:
        raise ConfigError(
            f"{source}({text!r}) does not split into overrides (unbalanced quotes): quote each value once, e.g. "
            "data.corpus='/my data (2024)/*.txt'"
        ) from None


def words(text: str) -> list[str]:
    """The overrides in `text`, each as Hydra is to read it: cut at whitespace outside quotes, words rejoined while a
    bracket they open is not closed (a list or dict with spaces is one override), and each made literal."""
    raw, out, at = raw_words(text), [], 0
    while at < len(raw):
        end = at + 1
        while depth(" ".join(raw[at:end])) > 0 and end < len(raw):
            end += 1
        end = end if depth(" ".join(raw[at:end])) == 0 else at + 1  # a bracket never closed: the word alone
        out.append(" ".join(raw[at:end]))
        at = end
    return [literal(word) for word in out]


def raw_words(text: str) -> list[str]:
    """`text` cut at whitespace outside quotes, the quotes and backslashes kept; ValueError for an unclosed quote."""
    found, word, quote, escaped = [], "", "", False
    for char in text:
        if escaped:
            word, escaped = word + char, False
        elif char == "\\" and quote != "'":
            word, escaped = word + char, True
        elif quote:
            word, quote = word + char, "" if char == quote else quote
        elif char in "'\"":
            word, quote = word + char, char
        elif char.isspace():
            found, word = found + [word] * bool(word), ""
        else:
            word += char
    if quote or escaped:
        raise ValueError(f"unclosed {quote or 'backslash'}")
    return found + [word] * bool(word)


def depth(word: str) -> int:
    """How many brackets the word opens and leaves open, outside quotes."""
    return sum(1 if char in "[{" else -1 for char in outside_quotes(word) if char in "[{]}")


def quoted(text: str) -> bool:
    """Whether `text` is one quoted string, '...' or "..." (its opening quote closed at its last character)."""
    if len(text) < 2 or text[0] not in "'\"":
        return False
    if text[0] == "'":
        return text.find("'", 1) == len(text) - 1
    closing = re.match(r'"(?:[^"\\]|\\.)*"', text)  # backslash escapes inside double quotes
    return closing is not None and closing.end() == len(text)


def literal(word: str) -> str:
    """One override as Hydra is to read it. A whole override in quotes ('key=v w') is the text inside them; a value
    wholly in quotes (key='/my data (2024)/*.txt') reaches Hydra quoted, so its spaces and ( ) [ ] , : are text, and
    so does one quoted for the split and for Hydra (key="'v'"), but a list or dict stays one (data.sources='[...]');
    a word without quotes loses its backslashes (a\\ b is "a b"); quotes inside a list or dict are Hydra's own."""
    if word[:1] in ("'", '"'):  # the whole override quoted as a shell word ('key=v w', or in pieces): the text it is
        return literal(shlex.split(word)[0])
    key, eq, value = word.partition("=")
    if eq and quoted(value):
        text = unquote(value)
        return f"{key}={text if quoted(text) or structured(text) else hydra_text(text)}"
    return re.sub(r"\\(.)", r"\1", word) if not re.search("['\"]", word) else word


def structured(text: str) -> bool:
    """Whether Hydra reads `text` as a list or dict (data.sources='[{...}]' was quoted to keep it one word)."""
    try:
        return isinstance(OverridesParser.create().parse_override(f"key={text}").value(), list | dict)
    except HydraException:
        return False


def unquote(text: str) -> str:
    """The text of a quoted string: '...' as it stands, "..." with its backslash escapes undone (POSIX shells')."""
    return text[1:-1] if text[0] == "'" else re.sub(r'\\([\\"$`])', r"\1", text[1:-1])


def hydra_text(text: str) -> str:
    """`text` as a quoted Hydra string, which Hydra reads as the text itself: in single quotes, or double ones where
    it holds a single quote (with both kinds, as it stands: Hydra then names what it cannot parse)."""
    for quote in ("'", '"'):
        if quote not in text and not text.endswith("\\"):
            return f"{quote}{text}{quote}"
    return text


def parses(word: str) -> bool:
    try:
        OverridesParser.create().parse_override(word)
        return True
    except HydraException:
        return False


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
    if isinstance(run, list | dict):  # YAML read brackets or braces: no name can hold them
        name = re.sub(r"[^A-Za-z0-9_.-]", "", str(run)).lstrip(".") or "lr1e3"
        raise ConfigError(
            f"--config run({run!r}) was read as a {type(run).__name__}, not a name (Snakemake's --config reads "
            f"brackets and braces as YAML): name the run with letters, digits, _ . - only, e.g. run={name}"
        )
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


def compose_phases(cfg: TrainflowConfig, words: list[str]) -> dict[str, TrainflowConfig]:
    """Each phase's config (train_segment's) by the checkpoint series it trains, in the phases' order (config.phases);
    `cfg` alone where it lists none."""
    if not cfg.phases:
        return {series_name(cfg): cfg}
    phases = (cfg if p.name == cfg.phase else compose("train_segment", [*words, f"phase={p.name}"]) for p in cfg.phases)
    return {series_name(c): c for c in phases}


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
