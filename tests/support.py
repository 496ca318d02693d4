"""What several test folders share that is no fixture: the workflow's command line and its job table, a free port
for a one-process group, and records made in a test (a step, a save, a job's metrics)."""

from __future__ import annotations

import re
import socket
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest

from tests.conftest import REPO
from trainflow.energy.metrics import JobMetrics

SNAKEMAKE = [sys.executable, "-m", "snakemake", "--snakefile", str(REPO / "Snakefile")]


def snakemake(workdir: Path, *args: str, check: bool = True) -> subprocess.CompletedProcess:
    """Snakemake on the repository's Snakefile in `workdir`; `output` holds both streams."""
    result = subprocess.run(
        [*SNAKEMAKE, "--directory", str(workdir), *args], capture_output=True, text=True, timeout=600
    )
    result.output = result.stdout + result.stderr
    if check and result.returncode:
        pytest.fail(
            f"snakemake {' '.join(args)} exited {result.returncode}:\n{result.stdout[-3000:]}\n{result.stderr[-3000:]}"
        )
    return result


def job_counts(output: str) -> dict[str, int]:
    """The `Job stats` table of a (dry) run."""
    table = output.split("Job stats:", 1)[1]
    return {m[1]: int(m[2]) for m in re.finditer(r"^(\w+)\s+(\d+)$", table, re.M) if m[1] != "total"}


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on right now."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def job_metrics(**fields: object) -> JobMetrics:
    """A job's metrics as run_stage would write them, these fields set and the rest empty."""
    base = {"stage": "s", "segment": 0, "job": "s", "wall_s": 1.0, "cpu_s": 0.0, "rapl_j": None, "gpu_j": None}
    return JobMetrics.from_json({**base, "host": "h", "slurm_job_id": None, "config": {}, **fields})


def marks(*rows: dict) -> list[SimpleNamespace]:
    """Step or save records with only the fields a test gives (the energy accounting reads them by name)."""
    return [SimpleNamespace(**row) for row in rows]
