"""verify_checkpoint's check of a checkpoint series and its report, verify.json: every checkpoint complete (its
folder holds exactly the files its manifest lists, every rank's among them) and every file re-read against its
CRC-32C. Torch-free: the stage starts without it.

    python -c "from trainflow.checkpoint.verify import verify_all; \
        print(verify_all('runs/default/capacity/checkpoints/<series>'))"
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from pathlib import Path

from trainflow.checkpoint.folders import list_steps, step_dir
from trainflow.checkpoint.manifest import ChecksumError, verify
from trainflow.errors import TrainflowError
from trainflow.records import Record

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class CheckpointCheck(Record):
    step: int
    files: int
    bytes: int
    world_size: int


@dataclass(frozen=True)
class VerifyFailure(Record):
    step: int
    error: str


@dataclass(frozen=True)
class VerifyReport(Record):
    checkpoints: list[CheckpointCheck]
    failures: list[VerifyFailure]
    """Empty in a written report: a failure stops the stage."""
    files: int
    bytes: int
    seconds: float
    gb_per_s: float | None
    algorithm: str


def merged(reports: list[VerifyReport]) -> VerifyReport:
    """The reports of several series (a campaign's phases) as one."""
    files, nbytes, seconds = (sum(getattr(r, k) for r in reports) for k in ("files", "bytes", "seconds"))
    return VerifyReport(
        checkpoints=[c for r in reports for c in r.checkpoints],
        failures=[f for r in reports for f in r.failures],
        files=files,
        bytes=nbytes,
        seconds=seconds,
        gb_per_s=nbytes / seconds / 1e9 if seconds else None,
        algorithm=reports[0].algorithm,
    )


class VerifyError(TrainflowError):
    """A checkpoint series that does not verify."""


def verify_all(root: str | Path) -> VerifyReport:
    """Verify every checkpoint under `root`; one VerifyError naming the count and the first failure."""
    root = Path(root)
    steps = list_steps(root)
    if not steps:
        raise VerifyError(f"{root} holds no checkpoint; run train_segment first")
    start = time.perf_counter()
    checked, failures = [], []
    for step in steps:
        try:
            manifest = verify(step_dir(root, step))
            checked.append(CheckpointCheck(step, len(manifest.files), manifest.nbytes, manifest.world_size))
        except ChecksumError as err:
            failures.append(VerifyFailure(step=step, error=str(err)))
    seconds = time.perf_counter() - start
    files, nbytes = sum(c.files for c in checked), sum(c.bytes for c in checked)
    log.info(
        "Verified %d checkpoints, %d files, %.1f MB in %.2f s: %d invalid",
        *(len(steps), files, nbytes / 1e6, seconds, len(failures)),
    )
    if failures:
        raise VerifyError(f"{len(failures)} checkpoint(s) failed verification, first: {failures[0].error}")
    gb_per_s = nbytes / seconds / 1e9 if seconds else None
    return VerifyReport(checked, failures, files, nbytes, seconds, gb_per_s, "crc32c")
