"""The loss-spike guard (train.guard): which steps it refuses, when it asks for a rollback, the data windows a
rollback leaves out (each a step's [start, end) of the stream's positions), and a checkpoint manifest's guard entry
read as the hostile file it may be."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from trainflow.checkpoint.manifest import MANIFEST, ChecksumError, Provenance, read_manifest, write_manifest
from trainflow.config.schema import SpikeConfig
from trainflow.data.stream import DataStream, StreamPosition
from trainflow.train.guard import GuardEvent, GuardState, LossGuard, read_guard_state


def test_a_step_draws_the_next_window_past_each_skipped_one():
    stream = DataStream(StreamPosition.start(block=4, names=["corpus"]), weights={"corpus": 1.0}, seed=0)
    stream.skip([[12, 20], [36, 40]])  # the windows of steps 3, 4 and 9 at a batch of 4
    starts = [stream.take(4).start // 4 for _ in range(9)]
    assert starts == [0, 1, 2, 5, 6, 7, 8, 10, 11]


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


def test_a_rollback_names_the_bad_windows_and_judges_on_from_the_checkpoint():
    guard = LossGuard(SpikeConfig(window=3, rollback_after=2))
    guard.restore(GuardState(losses=[5.0, 4.0, 3.0]))
    for step in (6, 7):
        guard.judge(step, [8 * step, 8 * step + 8], math.nan, 1.0)
    event = guard.rolled_back(4)
    assert event.windows == [[48, 56], [56, 64]] and not guard.rollback_due
    assert event.line() == (
        "step 7: rolled back to step 4 (2 bad steps in a row: step 6: loss nan; step 7: loss nan); "
        "skipped samples 48-55, 56-63"
    )
    guard.restore(GuardState(losses=[6.0, 5.0]))  # the checkpoint's (train.checkpointing)
    assert guard.state() == GuardState(losses=[6.0, 5.0])


def test_a_format_1_event_reads_with_its_window_numbers():
    old = {"step": 7, "action": "skipped", "reason": "loss nan", "windows": [9]}
    event = GuardEvent.from_json(old)
    assert (event.windows, event.unit) == ([[9, 10]], "windows")
    assert event.line() == "step 7: not applied (loss nan; data window 9)"


def manifest_folder(folder: Path, guard: GuardState | None = None) -> Path:
    """A one-rank checkpoint folder (its bytes made up) whose manifest records `guard`."""
    (folder / ".metadata").write_bytes(b"m")
    (folder / "__0_0.distcp").write_bytes(b"x")
    write_manifest(folder, world_size=1, step=4, provenance=Provenance(guard=guard))
    return folder


def test_a_manifest_without_a_guard_entry_is_an_empty_state(tmp_path):
    assert read_guard_state(read_manifest(manifest_folder(tmp_path))) == GuardState(losses=[])
    state = GuardState(losses=[3.5, 3.25])
    assert read_guard_state(read_manifest(manifest_folder(tmp_path, state))) == state


@pytest.mark.parametrize(
    ("entry", "message"),
    [
        ({"losses": [math.nan]}, "holds a non-finite loss"),
        ({"losses": ["3"]}, "holds '3', not a float"),
        ({"losses": [], "run": "os.system('x')"}, "holds 'run', which GuardState has no field for"),
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
