"""A dp2 resume reads the checkpoint once between its two ranks (checkpoint.single_read) and ends bitwise where an
uninterrupted run ends: the same losses and the same SHA-256 of every rank's model and optimizer state. The bytes are
the load's own log line, one per rank (CheckpointManager.load)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from tests.conftest import assert_resumes_bitwise, make_config
from trainflow.checkpoint.folders import list_steps, step_dir
from trainflow.checkpoint.manifest import METADATA, read_manifest

RUN = ("parallel=dp2", "train.global_batch=8", "checkpoint.interval_steps=100")
LOADED = re.compile(
    r"Loaded checkpoint step (\d+) in [0-9.]+ s: this rank read (\d+) bytes of its files, all 2 ranks (\d+)"
)


@pytest.mark.slow  # 3 dp2 segments (~3 min on this loaded VM); tests/unit/test_single_read.py counts bytes by default
def test_a_dp2_resume_reads_each_byte_once_and_resumes_bitwise(tmp_path, fixed_tokens):
    assert_resumes_bitwise(tmp_path, fixed_tokens, *RUN)
    cfg = make_config("train_segment", tmp_path / "halves", *RUN, "train.segments=2", "train.segment_steps=3")
    logs = "".join(p.read_text(errors="replace") for p in sorted(Path(cfg.io.submitit).glob("*_log.*")))
    loads = [(int(s), int(mine), int(total)) for s, mine, total in LOADED.findall(logs)]
    assert {step for step, _, _ in loads} == {3} and len(loads) == 2  # each rank of segment 1, once
    manifest = read_manifest(step_dir(Path(cfg.io.checkpoints), 3))
    assert 3 in list_steps(Path(cfg.io.checkpoints))
    # The shard files once between the ranks; .metadata, which DCP plans from, once by each.
    assert {total for _, _, total in loads} == {manifest.nbytes + manifest.files[METADATA].bytes}
    assert sum(mine for _, mine, _ in loads) == manifest.nbytes + manifest.files[METADATA].bytes
