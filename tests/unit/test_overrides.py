"""Hostile and careless config values: every field with a domain is checked when the DAG is built, and
no override string runs a command, reaches Hydra's machinery or points a path out of its folder."""

from __future__ import annotations

import dataclasses
import functools
import os
import re
import shlex
import subprocess
import typing
from pathlib import Path

import pytest
from hydra.core.override_parser.overrides_parser import OverridesParser
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from trainflow.config import RUN_NAME, ConfigError, Domain, TrainflowConfig, compose
from trainflow.config.overrides import check_workflow_config, compose_workflow, hydra_quote


def schema_fields(cls: type = TrainflowConfig, prefix: str = "") -> list[tuple[str, type, dataclasses.Field]]:
    """(dotted key, type, field) of every leaf field of the schema."""
    hints = typing.get_type_hints(cls)
    out = []
    for f in dataclasses.fields(cls):
        kind = hints[f.name]
        if dataclasses.is_dataclass(kind):
            out += schema_fields(kind, f"{prefix}{f.name}.")
        else:
            out.append((prefix + f.name, kind, f))
    return out


NUMERIC = [(key, kind, f) for key, kind, f in schema_fields() if kind in (int, float, list[float], list[int])]


def outside(domain: Domain, kind: type) -> object:
    """A value of the field's type just outside its domain."""
    number = float if kind in (float, list[float]) else int
    if domain.gt is not None:
        value = domain.gt
    elif domain.ge is not None:
        value = domain.ge - 1
    elif domain.lt is not None:
        value = domain.lt
    else:
        value = domain.le + 1
    return [number(value)] if kind in (list[float], list[int]) else number(value)


def test_every_numeric_field_has_a_domain():
    unchecked = [key for key, _, f in NUMERIC if "domain" not in f.metadata]
    assert not unchecked, f"numeric config fields without a domain (give them checked(...)): {unchecked}"


@pytest.mark.parametrize(("key", "kind", "field"), NUMERIC, ids=[k for k, _, _ in NUMERIC])
def test_an_out_of_domain_value_fails_at_compose_time_naming_the_key(key, kind, field):
    value = outside(field.metadata["domain"], kind)
    with pytest.raises(ConfigError) as err:
        compose("train_segment", [f"{key}={value}"])
    assert f"{key}(" in str(err.value) and "\n" not in str(err.value)


@pytest.mark.parametrize(
    ("override", "fragment"),
    [
        ("optim.lr=nan", "optim.lr(nan) must be a finite number"),
        ("cluster.allocation.executor=ssh", "cluster.allocation.executor('ssh') must be one of local, slurm"),
        ("fault.signal=HUP", "fault.signal('HUP') must be one of USR2, TERM, KILL, STOP"),
        ("fault.rank=2", "fault.rank(2) must be < the world size 2"),
        (
            "cluster.allocation.partition='debug --wrap=id'",
            "cluster.allocation.partition('debug --wrap=id') must match",
        ),
        (
            "+cluster.runtime.env.LD_PRELOAD=/tmp/x.so",
            "cluster.runtime.env.LD_PRELOAD is not a variable trainflow passes to ranks",
        ),
        ("+cluster.runtime.env.NCCL_NET_PLUGIN=/tmp/x.so", "cluster.runtime.env.NCCL_NET_PLUGIN is not a variable"),
        ("run=..", "run('..') must match"),
        ("run=.hidden", "run('.hidden') must match"),
        ("storage.root=runs/../x", "storage.root('runs/../x') climbs out of its folder through '..'"),
        ("io.report=/tmp/../etc/report.md", "io.report('/tmp/../etc/report.md') climbs out of its folder"),
        ("storage.root='/tmp/a$b'", "storage.root('/tmp/a$b') holds '$'"),
    ],
)
def test_values_that_cannot_run_or_escape_are_refused(override, fragment):
    with pytest.raises(ConfigError) as err:
        compose("train_segment", [override])
    assert fragment in str(err.value) and "\n" not in str(err.value)


@pytest.mark.parametrize(
    ("overrides", "fragment"),
    [
        ('experiment=smoke "run=x|touch /tmp/p|y', "run('x|touch /tmp/p|y') must match"),
        ("run=../x", "run('../x') must match"),
        ("--config-dir=/tmp", "is a command-line flag"),
        ("-m", "is a command-line flag"),
        ("+hydra.callbacks.x._target_=os.system", "changes Hydra itself"),
        ("hydra/job_logging=none", "changes Hydra itself"),
        ("hydra.searchpath=[file:///tmp]", "changes Hydra itself"),
        ("cluster=../../../../tmp/x", "must name a preset in conf/cluster/ by its name alone"),
        ("cluster.allocation.setup=[id]", "sets shell lines of the sbatch script"),
        ("optim.lr=1e-3,2e-3", "is a sweep"),
        ("model@optim=tiny", "moves a config package"),
        ("optim.lr=(1", "does not parse"),
        ('optim.lr=(1 "x', "does not split into overrides"),
    ],
)
def test_workflow_overrides_that_could_do_more_than_set_a_value_are_refused(overrides, fragment):
    with pytest.raises(ConfigError) as err:
        compose_workflow("default", "", overrides)
    assert fragment in str(err.value) and "\n" not in str(err.value)


@pytest.mark.parametrize("run", ["123", "1e3", "true", "007"])
def test_a_run_named_like_a_number_keeps_its_name(run):
    # `--config 'run=!!str 1e3'` reaches the workflow as the text 1e3: every stage is given it quoted, not 1000.0
    cfg, words = compose_workflow(run, "", "")
    assert cfg.run == run and compose("train_segment", words).run == run


def test_readme_quoting_survives_snakemake_stripping_the_closing_quote():
    # `--config overrides="data.corpus='/x/*.txt'"` reaches the workflow as "data.corpus='/x/*.txt"
    cfg, words = compose_workflow("default", "", "data.corpus='/x/*.txt")
    assert cfg.data.corpus == "/x/*.txt" and words[-1] == "data.corpus='/x/*.txt'"  # quoted on for every stage


@pytest.mark.parametrize(
    "path",
    [
        "/tmp/my run/tokens.h5",
        "runs/a,b/[1]{x}=y:z.h5",
        "plain/path.h5",
        "~/x#y%z&*?",
        "1e3",
        "1_000",
        "true",
        "null",
        "~/x",
    ],
)
def test_hydra_quote_passes_paths_literally(path):
    assert OverridesParser.create().parse_override(f"io.tokens={hydra_quote(path)}").value() == path
    items = OverridesParser.create().parse_override(f"io.run_metrics={hydra_quote([path, 'b c'])}").value()
    assert items == [path, "b c"]


KEYS = [key for key, _, _ in schema_fields()]
SHELL = "|;&$`'\"\\<>(){}[]*?~#!=,. \t\n"
WORD = st.text(alphabet=st.sampled_from("abcxyz019-_/" + SHELL), max_size=12)
VALUE = st.one_of(WORD, st.integers(-10, 10).map(str), st.floats(allow_nan=True).map(repr))
OVERRIDE = st.one_of(
    st.tuples(st.sampled_from(["", "+", "++", "~"]), st.sampled_from(KEYS + ["hydra.run.dir", "cluster"]), VALUE).map(
        lambda t: f"{t[0]}{t[1]}={t[2]}"
    ),
    WORD,
)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.lists(OVERRIDE, max_size=4), st.sampled_from([" ", " '", ' "']))
def test_random_override_strings_compose_or_fail_in_one_line_and_run_nothing(tmp_path, words, joiner):
    """Each string composes or fails with one ConfigError line; a composed one travels through the
    shell exactly as the rules send it (quoted), so the stage receives the words and nothing runs."""
    outside = sorted(os.listdir(tmp_path.parent))
    text = joiner.join(words)
    try:
        cfg, overrides = compose_workflow("default", "", text)
    except ConfigError as err:
        assert "\n" not in str(err)
        return
    finally:
        assert sorted(os.listdir(tmp_path.parent)) == outside
    assert re.fullmatch(RUN_NAME, cfg.run) and ".." not in Path(cfg.storage.root).parts
    out = tmp_path / "argv"
    log = Path(cfg.storage.root) / "logs" / "x.log"
    line = f"printf '%s\\n' {shlex.join(overrides)} > {shlex.quote(str(out))}; echo {shlex.quote(str(log))}"
    subprocess.run(["/bin/sh", "-c", line], cwd=tmp_path, check=True, capture_output=True)
    assert out.read_text().split("\n")[:-1] == overrides
    assert sorted(p.name for p in tmp_path.iterdir()) == ["argv"]


def quoting_table() -> list[tuple[str, str]]:
    """The rows of docs/configuration.md's table of overrides as given inside overrides="..." and their values."""
    page = (Path(__file__).parents[2] / "docs/configuration.md").read_text()
    table = page.split('| inside `overrides="..."` | the key\'s value |')[1].split("\n\n")[0]
    return re.findall(r"^ *\| `(.+?)` \| (.+?) \|$", table, re.M)


@pytest.mark.parametrize(("given", "value"), quoting_table())
def test_the_quoting_rules_of_the_configuration_page_are_the_codes(given, value):
    """Issue 43, case 7: a corpus path with parentheses quoted as the page said was refused ("unbalanced quotes");
    each row also survives Snakemake dropping the string's closing quote."""
    key = given.lstrip("+").partition("=")[0]
    for text in (given, given[:-1] if given[-1] in "'\"" else given):
        cfg, _ = compose_workflow("default", "", text)
        got = functools.reduce(getattr, key.split(".")[:-1], cfg)
        got = got[key.rpartition(".")[2]] if isinstance(got, dict) else getattr(got, key.rpartition(".")[2])
        if value.startswith("`"):
            assert got == value.strip("`"), (text, got)
        else:
            assert value == "a list of one source" and [s.name for s in got] == ["web"], (text, got)


def hint(line: str, before: str) -> str:
    """The fix a one-line error gives after `before`, as written."""
    assert "\n" not in line and before in line, line
    return line.split(before, 1)[1]


def test_each_hint_followed_as_written_works():
    """Issue 43, case 7: `+` was not hinted for an open dict's new key, a bracket hint quoted a list into a string,
    and an unbalanced string was told to "quote each value once" with nothing to follow."""
    with pytest.raises(ConfigError) as err:
        compose_workflow("default", "", "cluster.runtime.env.NCCL_DEBUG=INFO")
    fixed = hint(str(err.value), "add it with a leading +, ")
    assert compose_workflow("default", "", fixed)[0].cluster.runtime.env == {"NCCL_DEBUG": "INFO"}
    with pytest.raises(ConfigError) as err:
        compose("train_segment", ["cluster.runtime.env.NCCL_DEBUG=INFO"])  # a stage's command line alike
    assert compose("train_segment", [hint(str(err.value), "leading +, ")]).cluster.runtime.env["NCCL_DEBUG"] == "INFO"

    with pytest.raises(ConfigError) as err:
        compose_workflow("default", "", "cluster.gate.sweep_mb=[0.25,1.0 optim.lr=1e-3")
    fixed = hint(str(err.value), "close what its value opens, e.g. ")
    assert compose_workflow("default", "", f"{fixed} optim.lr=1e-3")[0].cluster.gate.sweep_mb == [0.25, 1.0]
    with pytest.raises(ConfigError) as err:
        compose("validate_nccl", ["cluster.gate.sweep_mb=[0.25,1.0"])
    shell = hint(str(err.value), "close what its value opens, e.g. ")
    assert compose("validate_nccl", shlex.split(shell)).cluster.gate.sweep_mb == [0.25, 1.0]

    with pytest.raises(ConfigError) as err:
        compose_workflow("default", "", "data.corpus='/a b' 'x")
    example = hint(str(err.value), "quote each value once, e.g. ")
    assert compose_workflow("default", "", example)[0].data.corpus == "/my data (2024)/*.txt"

    with pytest.raises(ConfigError) as err:
        check_workflow_config({"run": ["a"]})  # --config run=[a], which Snakemake reads as YAML
    assert hint(str(err.value), "e.g. ") == "run=a" and check_workflow_config({"run": "a"})["run"] == "a"
