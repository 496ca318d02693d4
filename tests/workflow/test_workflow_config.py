"""Snakemake's own config refused in trainflow's one line (not its JSON schema's dump), before any stage runs."""

from __future__ import annotations

from tests.conftest import REPO
from tests.support import snakemake


def test_a_run_name_that_is_no_name_is_one_line(tmp_path):
    result = snakemake(tmp_path, "--profile", str(REPO / "profiles/local"), "--config", "run=..", "-n", check=False)
    assert result.returncode != 0
    lines = [line for line in result.output.splitlines() if "must be a plain name" in line]
    assert len(lines) == 1 and lines[0].startswith("--config run('..')"), result.output[-2000:]
    assert "Failed validating" not in result.output and not (tmp_path / "runs").exists()
