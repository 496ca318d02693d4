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


def wandb_history(folder: Path) -> dict[int, dict]:
    """Every offline W&B run's logged rows under `folder` (WANDB_DIR), by step."""
    import json

    rows: dict[int, dict] = {}
    for record in wandb_records(folder, "history"):
        row = {i.key or "/".join(i.nested_key): json.loads(i.value_json) for i in record.history.item}
        rows.setdefault(row["_step"], {}).update(row)
    return rows


def wandb_records(folder: Path, kind: str) -> list:
    """The records of `kind` (history, run, ...) of every offline W&B run under `folder`, read from its .wandb files
    with W&B's own record type (wandb 0.31 ships no reader in Python): a LevelDB log of 32 KiB blocks after a 7-byte
    header, each chunk a CRC, a length, a type (1 whole, 2 first, 3 middle, 4 last) and part of one Record."""
    import struct

    from wandb.proto import wandb_internal_pb2

    found = []
    for path in sorted(folder.glob("wandb/offline-run-*/run-*.wandb")):
        data, pos, payload = path.read_bytes(), 7, b""
        assert data[:4] == b":W&B"
        while pos + 7 <= len(data):
            if (left := 32768 - pos % 32768) < 7:
                pos += left
                continue
            _crc, length, chunk = struct.unpack("<IHB", data[pos : pos + 7])
            payload, pos = payload + data[pos + 7 : pos + 7 + length], pos + 7 + length
            if chunk in (1, 4):
                record = wandb_internal_pb2.Record.FromString(payload)
                payload = b""
                if record.WhichOneof("record_type") == kind:
                    found.append(record)
    return found
