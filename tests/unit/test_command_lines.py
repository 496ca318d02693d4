"""Command lines a new user types wrong, each refused in one line with its fix: `python -m trainflow.plan` on a plan
that does not fit (exit 1, as validate_nccl stops), and Snakemake's --config with a key, type or run name it does not
take (trainflow's line, not the JSON schema's dump; the workflow test runs it through Snakemake)."""

from __future__ import annotations

import re

import pytest

from trainflow.config import ConfigError
from trainflow.config.overrides import check_workflow_config
from trainflow.plan.__main__ import main

OK = {"run": "default", "site": "", "overrides": ""}


def test_a_vanishing_peak_is_refused_in_a_bounded_line_naming_it(capsys):
    """Issue 43, case 8: cluster.hardware.peak_tflops=1e-300 printed a 300-digit number without naming the input."""
    assert main(["cluster.hardware.peak_tflops=1e-300"]) == 1
    (line,) = capsys.readouterr().err.splitlines()
    assert line.startswith("trainflow.plan: invalid config: cluster.hardware.peak_tflops(1e-300) must be >= 0.001 (")
    assert len(line) < 200
    typical = re.search(r"a CPU core's is about ([\d.]+)", line)[1]
    assert main([f"cluster.hardware.peak_tflops={typical}"]) == 0


def test_a_plan_that_does_not_fit_exits_1_after_printing_it(capsys):
    assert main(["experiment=llama70b_alps", "train.precision=fp32", "train.activations=keep"]) == 1
    out, err = capsys.readouterr()
    assert "pipeline rank" in out  # the plan is printed: it says which term to change
    (line,) = err.splitlines()
    assert line.startswith("trainflow.plan: the plan does not fit: ") and "train.activations=recompute" in line
    assert main(["experiment=smoke"]) == 0


@pytest.mark.parametrize(
    ("config", "match"),
    [
        ({**OK, "run": ".."}, r"--config run\('\.\.'\) must be a plain name .* give e\.g\. run=lr1e3"),
        ({**OK, "run": "a/b"}, r"--config run\('a/b'\) must be a plain name"),
        ({**OK, "run": 5}, r"--config run\(5\) was read as int, not a name .* --config 'run=!!str 5' .* run=r5"),
        ({**OK, "run": None}, r"--config run= is empty: name the run, e\.g\. run=lr1e3"),
        ({**OK, "overrides": 1.5}, r"--config overrides\(1\.5\) was read as float: give Hydra overrides"),
        ({**OK, "lr": "1e-3"}, r"--config lr=\.\.\. is no workflow setting: give run=, site=, overrides="),
    ],
)
def test_a_bad_workflow_config_is_one_line(config, match):
    with pytest.raises(ConfigError, match=match) as err:
        check_workflow_config(config)
    assert "\n" not in str(err.value)
    check_workflow_config(OK)
