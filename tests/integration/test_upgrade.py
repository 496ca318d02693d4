"""A campaign outlives the trainflow that began it: a run folder of release bf6c828 (before campaign records and
record formats: tests/assets/release-bf6c828, made by its make.py) is adopted by today's trainflow and its segment 1
trains bit for bit as that release trained it; a record of a newer format is refused in one line, changing nothing."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from tests.conftest import REPO, make_config, run_segment
from trainflow.campaign.segments import lineage
from trainflow.checkpoint.folders import list_steps, step_dir
from trainflow.config.run_folder import RunFolder
from trainflow.records import NewerFormatError
from trainflow.train.adopt import check_legacy, legacy_series

RELEASE = REPO / "tests/assets/release-bf6c828"
EXPECTED = json.loads((RELEASE / "expected.json").read_text())


@pytest.fixture
def old_run(tmp_path) -> Path:
    root = tmp_path / "run"
    shutil.copytree(RELEASE / "run", root)
    return root


def test_a_series_of_an_older_release_is_adopted_and_resumes_bitwise(old_run, fixed_tokens):
    cfg = make_config("train_segment", old_run, *EXPECTED["overrides"], "segment=1", tokens=fixed_tokens)
    assert legacy_series(cfg) == EXPECTED["series"]  # today's config names that release's series
    summary = run_segment(old_run, fixed_tokens, *EXPECTED["overrides"], "segment=1")
    assert [r["loss"] for r in summary["steps"]] == EXPECTED["losses"]
    assert summary["state_digest"] == EXPECTED["state_digest"]  # bit for bit the release's own segment 1
    assert not (old_run / "capacity/checkpoints" / EXPECTED["series"]).exists()  # renamed to the campaign's series
    done = lineage(cfg.io.checkpoints)
    assert done[0].continued_from == f"series {EXPECTED['series']} of a trainflow before campaign records"
    assert (done[1].start_step, done[1].end_step, done[1].continued_from) == (4, 8, f"{RunFolder.of(cfg).series}@4")
    assert summary["lineage"]["segment"] == 1


def test_a_manifest_of_a_newer_format_is_refused_in_one_line(old_run, fixed_tokens):
    cfg = make_config("train_segment", old_run, *EXPECTED["overrides"], "segment=1", tokens=fixed_tokens)
    folder = old_run / "capacity/checkpoints" / EXPECTED["series"]
    manifest = step_dir(folder, list_steps(folder)[-1]) / "manifest.json"
    manifest.write_text(json.dumps({**json.loads(manifest.read_text()), "format": 99}))
    before = sorted(p.relative_to(old_run) for p in old_run.rglob("*"))
    with pytest.raises(NewerFormatError) as err:
        run_segment(old_run, fixed_tokens, *EXPECTED["overrides"], "segment=1")
    assert str(err.value).count("\n") == 0 and "Manifest format 99" in str(err.value)
    assert "written by a newer trainflow" in str(err.value) and "upgrade trainflow" in str(err.value)
    with pytest.raises(NewerFormatError):  # the workflow's check, before the DAG: the same line
        check_legacy(cfg)
    assert sorted(p.relative_to(old_run) for p in old_run.rglob("*")) == before  # nothing moved or written
