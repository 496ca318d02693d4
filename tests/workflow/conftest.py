"""The smoke experiment's whole DAG on the local profile, run once per session: the tests that steer or rerun a
finished campaign each start from their own copy of its folder (Snakemake's records and the run folder, mtimes kept),
so the ~minute of its first run is paid once."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from tests.conftest import REPO
from tests.support import snakemake

SMOKE = ("--profile", str(REPO / "profiles/local"), "--config", "overrides=experiment=smoke")


@pytest.fixture(scope="session")
def smoke_dag(tmp_path_factory) -> Path:
    """The folder the smoke DAG ran in (runs/default/ and .snakemake/): copy it, never change it."""
    work = tmp_path_factory.mktemp("smoke-dag")
    snakemake(work, *SMOKE)
    return work


@pytest.fixture
def smoke_run(smoke_dag, tmp_path) -> Path:
    """A copy of the finished smoke DAG's folder, this test's to change."""
    shutil.copytree(smoke_dag, tmp_path, symlinks=True, dirs_exist_ok=True)
    return tmp_path
