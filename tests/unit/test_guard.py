"""The loss-spike guard (train.guard): which steps it refuses, when it asks for a rollback, the data windows a
rollback leaves out, and a checkpoint manifest's guard entry read as the hostile file it may be."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from trainflow.checkpoint.manifest import MANIFEST, ChecksumError, Provenance, read_manifest, write_manifest
from trainflow.config.schema import SpikeConfig
from trainflow.train.guard import GuardState, LossGuard, read_guard_state


def test_a_step_draws_the_next_window_past_each_skipped_one():
    guard = LossGuard(SpikeConfig())
    guard.restore(GuardState(skipped=[3, 4, 9], losses=[]))
    assert [guard.window(step) for step in range(9)] == [0, 1, 2, 5, 6, 7, 8, 10, 11]


@pytest.mark.parametrize(("loss", "norm", "why"), [(math.nan, 1.0, "loss nan"), (2.0, math.inf, "gradient norm inf")])
def test_non_finite_loss_or_gradient_norm_is_refused(loss, norm, why):
    assert LossGuard(SpikeConfig()).judge(0, 0, loss, norm) == why


def test_a_spike_is_judged_against_the_full_window_of_applied_losses():
    guard = LossGuard(SpikeConfig(window=4, factor=3.0, rollback_after=2))
    for step, loss in enumerate([2.0, 2.1, 1.9, 2.0]):
        assert guard.judge(step, step, loss, 1.0) is None
    # mean 2.0, deviation 0.0707: 2.2 is 2.8 deviations above (applied), 2.3 is 4.2 above (refused)
    assert guard.judge(4, 4, 2.2, 1.0) is None
    reason = guard.judge(5, 5, 2.5, 1.0)
    assert reason is not None and reason.startswith("loss 2.5000 > ") and "last 4 applied steps" in reason
    assert not guard.rollback_due
    assert guard.judge(6, 6, math.nan, 1.0) == "loss nan"
    assert guard.rollback_due and guard.first_bad == 5


def test_an_early_spike_is_not_judged_before_the_window_fills():
    guard = LossGuard(SpikeConfig(window=50))
    assert guard.judge(0, 0, 10.0, 1.0) is None and guard.judge(1, 1, 100.0, 1.0) is None


def test_a_good_step_ends_the_run_of_bad_ones():
    guard = LossGuard(SpikeConfig(rollback_after=2))
    guard.judge(0, 0, math.nan, 1.0)
    guard.judge(1, 1, 3.0, 1.0)
    guard.judge(2, 2, math.nan, 1.0)
    assert not guard.rollback_due


def test_a_rollback_leaves_the_bad_windows_out_and_judges_on_from_the_checkpoint():
    guard = LossGuard(SpikeConfig(window=3, rollback_after=2))
    guard.restore(GuardState(skipped=[1], losses=[5.0, 4.0, 3.0]))
    for step in (6, 7):
        guard.judge(step, guard.window(step), math.nan, 1.0)
    event = guard.rolled_back(4, GuardState(skipped=[1], losses=[6.0, 5.0]))
    assert guard.state() == GuardState(skipped=[1, 7, 8], losses=[6.0, 5.0])
    assert not guard.rollback_due
    assert event.line() == (
        "step 7: rolled back to step 4 (2 bad steps in a row: step 6: loss nan; step 7: loss nan); "
        "skipped data windows 7, 8"
    )
    assert [guard.window(step) for step in range(4, 8)] == [5, 6, 9, 10]


def manifest_folder(folder: Path, guard: GuardState | None = None) -> Path:
    """A one-rank checkpoint folder (its bytes made up) whose manifest records `guard`."""
    (folder / ".metadata").write_bytes(b"m")
    (folder / "__0_0.distcp").write_bytes(b"x")
    write_manifest(folder, world_size=1, step=4, provenance=Provenance(guard=guard))
    return folder


def test_a_manifest_without_a_guard_entry_is_an_empty_state(tmp_path):
    assert read_guard_state(read_manifest(manifest_folder(tmp_path))) == GuardState(skipped=[], losses=[])
    state = GuardState(skipped=[2, 5], losses=[3.5, 3.25])
    assert read_guard_state(read_manifest(manifest_folder(tmp_path, state))) == state


@pytest.mark.parametrize(
    ("entry", "message"),
    [
        ({"skipped": [-1], "losses": []}, "negative data window or a non-finite loss"),
        ({"skipped": [], "losses": [math.nan]}, "negative data window or a non-finite loss"),
        ({"skipped": ["3"], "losses": []}, "holds '3', not a int"),
        ({"skipped": [], "losses": [], "run": "os.system('x')"}, "holds 'run', which GuardState has no field for"),
        ("[1, 2]", "not an object of GuardState's fields"),
    ],
)
def test_a_hostile_guard_entry_fails_in_one_line(tmp_path, entry, message):
    folder = manifest_folder(tmp_path)
    manifest = json.loads((folder / MANIFEST).read_text())
    (folder / MANIFEST).write_text(json.dumps({**manifest, "guard": entry}))
    with pytest.raises(ChecksumError, match=message) as err:
        read_manifest(folder)
    assert f"{folder / MANIFEST}.guard" in str(err.value) and "\n" not in str(err.value)
