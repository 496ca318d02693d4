"""Shared fixtures and helpers: small real token files (the standard library's sources, a fixed corpus),
config composition, "train a segment and return its summary", and the golden-loss comparison."""

from __future__ import annotations

import contextlib
import json
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch.distributed as dist

from trainflow.config import TrainflowConfig, compose
from trainflow.data.tokens import write_shard  # noqa: F401  (imported early: h5py before torch.distributed)
from trainflow.preflight import preflight
from trainflow.stages import prepare_data, train_segment

REPO = Path(__file__).resolve().parents[1]
GOLDEN = REPO / "tests/assets/golden/losses_10_steps.txt"
GOLDEN_RTOL = 1e-5


@pytest.fixture(scope="session")
def tokens(tmp_path_factory) -> Path:
    """~400 kB of real Python source, byte-tokenised, with a validation split: the index of its one shard."""
    out = tmp_path_factory.mktemp("data") / "index.json"
    cfg = compose("prepare_data", ["experiment=smoke", f"io.tokens={out}"])
    prepare_data.run(cfg)
    return out


@contextlib.contextmanager
def mounted_tmpfs(folder: Path, size: str) -> Iterator[Path]:
    """A real tmpfs of `size` mounted at `folder` for the block: what fills it fails with ENOSPC."""
    folder.mkdir()
    done = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(folder)], capture_output=True)
    if done.returncode:
        pytest.skip(f"mounting a {size} tmpfs failed ({done.stderr.decode().strip()}); the test needs root (CI: root)")
    try:
        yield folder
    finally:
        subprocess.run(["umount", str(folder)], check=True)


@pytest.fixture
def tiny_tmpfs(tmp_path):
    """A real 256 kB file system: a checkpoint larger than that fails with ENOSPC."""
    with mounted_tmpfs(tmp_path / "tmpfs", "256k") as mount:
        yield mount


@pytest.fixture(scope="module")
def one_rank_group():
    """A one-process gloo group for a module's tests (`pytestmark = pytest.mark.usefixtures("one_rank_group")`)."""
    from tests.support import free_port

    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{free_port()}", rank=0, world_size=1)
    yield
    dist.destroy_process_group()


def make_config(stage: str, root: Path, *overrides: str, tokens: Path | None = None) -> TrainflowConfig:
    """A smoke-sized config whose every path lies under `root`, composed and pre-flight checked as a stage's is."""
    extra = [f"io.staged_tokens={tokens}", f"io.tokens={tokens}"] if tokens else []
    cfg = compose(stage, ["experiment=smoke", f"storage.root={root}", *extra, *overrides])
    preflight(cfg)
    return cfg


@pytest.fixture(scope="session")
def fixed_tokens(tmp_path_factory) -> Path:
    """Tokens of the fixed corpus in tests/assets/corpus: the input of the golden loss files."""
    out = tmp_path_factory.mktemp("fixed") / "index.json"
    cfg = compose(
        "prepare_data", ["experiment=smoke", f"data.corpus={REPO}/tests/assets/corpus/*.txt", f"io.tokens={out}"]
    )
    prepare_data.run(cfg)
    return out


def read_json(path: str | Path) -> dict:
    """A stage's JSON output as the file holds it (the keys docs/runs.md documents)."""
    return json.loads(Path(path).read_text())


def run_segment(root: Path, tokens: Path, *overrides: str) -> dict:
    """Train one segment through the real launcher (submitit, one process per rank); its summary."""
    cfg = make_config("train_segment", root, *overrides, tokens=tokens)
    train_segment.run(cfg)
    return read_json(cfg.io.segment_report)


def assert_resumes_bitwise(root: Path, tokens: Path, *run: str) -> list[str]:
    """Two segments of 3 steps (the second resumed from the first's checkpoint) end where one segment of 6
    ends: the same losses and the same SHA-256 of every rank's model and optimizer state (returned)."""
    whole = run_segment(root / "whole", tokens, *run, "train.segments=1", "train.segment_steps=6")
    halves = [
        run_segment(root / "halves", tokens, *run, "train.segments=2", "train.segment_steps=3", f"segment={s}")
        for s in (0, 1)
    ]
    assert step_losses(*halves) == step_losses(whole)
    assert halves[1]["state_digest"] == whole["state_digest"]
    return whole["state_digest"]


def step_losses(*summaries: dict) -> list[float]:
    return [r["loss"] for s in summaries for r in s["steps"]]


def read_golden() -> list[float]:
    """The single-process run's losses of 10 steps on the fixed corpus (tests/distributed/test_parity.py)."""
    if not GOLDEN.exists():
        pytest.fail(f"{GOLDEN} is missing: create it with TRAINFLOW_REGEN_GOLDEN=1 pytest tests/distributed -k single")
    return [float(line.split()[1]) for line in GOLDEN.read_text().splitlines()]


def assert_matches_golden(losses: list[float], label: str) -> None:
    golden = read_golden()
    worst = max(abs(a - b) / abs(b) for a, b in zip(losses, golden))
    assert len(losses) == len(golden) and worst <= GOLDEN_RTOL, (
        f"{label}: losses differ from {GOLDEN.name} by up to {worst:.2e} (relative, allowed {GOLDEN_RTOL:.0e}): "
        f"{losses} vs {golden}. If the single-process run changed on purpose, delete the golden file and rerun "
        "with TRAINFLOW_REGEN_GOLDEN=1 -k single"
    )


# The second-torch job's subset (scripts/test.sh runs `-m torch_compat` under the oldest supported torch): the unit
# modules that call torch's own APIs (checkpoints through DCP, the model, FP8, activation modes, the plan's torch
# counts, the export) and the distributed tests that found every difference of torch 2.11 (trainflow.torch_compat).
TORCH_COMPAT = {
    "tests/unit/test_activations.py",
    "tests/unit/test_checkpoint_async.py",
    "tests/unit/test_checkpoint_attacks.py",
    "tests/unit/test_checkpoint_io.py",
    "tests/unit/test_checksums.py",
    "tests/unit/test_data.py",
    "tests/unit/test_export.py",
    "tests/unit/test_fp8.py",
    "tests/unit/test_fp8_ranks.py",
    "tests/unit/test_memory.py",
    "tests/unit/test_model.py",
    "tests/unit/test_plan.py",
    "tests/unit/test_shape.py",
    "tests/unit/test_torch_compat.py",
    "tests/distributed/test_parity.py::test_losses_match_one_process[dp2]",  # the default layout, a smoke segment
    "tests/distributed/test_parity.py::test_losses_match_one_process[pp2_1f1b]",
    "tests/distributed/test_parity.py::test_losses_match_one_process[pp2_interleaved]",
    "tests/distributed/test_parity.py::test_losses_match_one_process[dp2_shard]",
    "tests/distributed/test_reshard.py::test_resume_in_another_layout[tp2-to-pp2]",
}


@pytest.hookimpl(tryfirst=True)  # before `-m` deselects by marker
def pytest_collection_modifyitems(config, items) -> None:
    """Mark TORCH_COMPAT's tests `torch_compat`. Under `-m torch_compat` an entry whose file was collected but that
    names no test is an error, so a renamed test cannot silently leave the subset."""
    matched = set()
    for item in items:
        path = Path(item.path).relative_to(REPO).as_posix()
        for entry in (path, f"{path}::{item.name}"):
            if entry in TORCH_COMPAT:
                item.add_marker(pytest.mark.torch_compat)
                matched.add(entry)
    collected = {Path(item.path).relative_to(REPO).as_posix() for item in items}
    if "torch_compat" not in (config.option.markexpr or ""):
        return
    if stale := sorted(e for e in TORCH_COMPAT - matched if e.split("::")[0] in collected):
        raise pytest.UsageError(f"tests/conftest.py's TORCH_COMPAT names no collected test: {stale}; update it")
