"""A campaign in phases at the stage level (docs/phases.md): a later phase opens its own series with its parent's last
checkpoint resharded into its layout, bit for bit, and names what it carried across (rotary scaling); a decay phase
branched from a stable checkpoint leaves the stable series as it was."""

from __future__ import annotations

from pathlib import Path

import torch
from torch.distributed.checkpoint.format_utils import dcp_to_torch_save

from tests.conftest import make_config, run_segment
from trainflow.campaign.records import SeriesRecord
from trainflow.checkpoint.folders import list_steps, step_dir
from trainflow.config.run_folder import RunFolder
from trainflow.records import read_record

ONE = ("experiment=smoke_phases", "train.segments=1", "checkpoint.interval_steps=3")  # 6 steps a phase
ANNEAL = 'phases=[{name:pretrain,overrides:["optim.schedule=wsd"]},{name:anneal,from_step:3,overrides:["optim.schedule=wsd","optim.decay_steps=6"]}]'  # noqa: E501


def whole(folder: Path, out: Path) -> dict:
    """A checkpoint's tensors as whole (unsharded) tensors by key, read without a process group."""
    dcp_to_torch_save(folder, out)
    return torch.load(out, weights_only=False)


def assert_bitwise(a: dict, b: dict, where: str = "") -> None:
    assert a.keys() == b.keys(), where
    for key in a:
        if isinstance(a[key], dict):
            assert_bitwise(a[key], b[key], f"{where}.{key}")
        elif isinstance(a[key], torch.Tensor):
            assert torch.equal(a[key], b[key]), f"{where}.{key}"


def snapshot(folder: Path) -> dict[str, tuple[int, int]]:
    return {str(p.relative_to(folder)): (p.stat().st_size, p.stat().st_mtime_ns) for p in folder.rglob("*")}


def test_a_later_phase_opens_its_series_with_its_parents_last_checkpoint_resharded_bitwise(tmp_path, fixed_tokens):
    run_segment(tmp_path, fixed_tokens, *ONE, "phase=pretrain", "segment=0")
    phase = run_segment(tmp_path, fixed_tokens, *ONE, "phase=long_context", "segment=0")
    cfg = make_config("train_segment", tmp_path, *ONE, "phase=long_context", tokens=fixed_tokens)
    parent = Path(RunFolder.of(cfg).series_checkpoints(cfg.phases[0].series))
    mine = Path(cfg.io.checkpoints)
    assert list_steps(parent)[-1] == 6 and list_steps(mine)[0] == 6  # it opens at its parent's end, in tp2
    opened = whole(step_dir(mine, 6), tmp_path / "opened.pt")
    assert_bitwise(opened, whole(step_dir(parent, 6), tmp_path / "parent.pt"))
    assert {"model", "optim"} <= opened.keys() and opened["model"] and opened["optim"]
    assert phase["start_step"] == 6 and phase["end_step"] == 12
    lineage = phase["lineage"]
    assert lineage["continued_from"] == f"{cfg.phases[0].series}@6"
    changed = {c["change"]["key"]: (c["change"]["before"], c["change"]["after"]) for c in lineage["changes"]}
    assert changed["model.rope_scaling"] == ("none", "llama3") and changed["model.seq_len"] == (128, 256)
    assert changed["parallel.name"] == ("dp2", "tp2")
    record = read_record(SeriesRecord, RunFolder.series_record(mine))
    assert (record.phase, record.parent.line()) == ("long_context", f"{cfg.phases[0].series}@6")

    before = snapshot(parent)  # a decay branched from the stable phase's step 3: the stable series stays as it was
    anneal = run_segment(tmp_path, fixed_tokens, *ONE, ANNEAL, "phase=anneal", "segment=0")
    assert snapshot(parent) == before
    assert (anneal["start_step"], anneal["end_step"]) == (3, 9)
    assert anneal["lineage"]["continued_from"] == f"{cfg.phases[0].series}@3"
