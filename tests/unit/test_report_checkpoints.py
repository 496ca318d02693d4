"""The report's checkpoint section (report.sections.checkpoints): every segment's saves, with the blocking and
background seconds and the slowdown of the steps that ran beside a background write."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

from trainflow.checkpoint.interval import IntervalPlan
from trainflow.report.sections import checkpoints
from trainflow.train.summary import SaveRecord

VERIFY = SimpleNamespace(files=6, checkpoints=[1, 2], bytes=4e6, algorithm="crc32c", failures=[])


def segment(index: int, saves: list[SaveRecord], step_s: dict[int, float]) -> SimpleNamespace:
    """What the section reads of a SegmentSummary."""
    plan = IntervalPlan("fixed", 4, save_s=0.01, step_s=0.1, mtbf_s=14400.0, interval_s=None, background_s=None)
    steps = [SimpleNamespace(step=k, step_s=t) for k, t in sorted(step_s.items())]
    return SimpleNamespace(segment=index, saves=saves, steps=steps, setup=SimpleNamespace(checkpoint_interval=plan))


def test_every_segment_s_saves_are_rows_and_the_overlap_is_judged_within_its_segment():
    sync = segment(0, [SaveRecord(step=4, started=0.0, save_s=0.25)], {k: 0.1 for k in range(5)})
    times = {4: 9.0, 5: 0.1, 6: 0.3, 7: 0.3, 8: 0.1, 9: 0.1}  # step 4, the segment's first, is left out
    background = SaveRecord(step=6, started=0.0, save_s=0.01, background_s=0.5, waited_s=0.02, overlap_steps=2)
    text = "\n".join(checkpoints([sync, segment(1, [background], times)], VERIFY, "/r/verify.json", Path("/r/report")))
    assert "| segment | step | blocking s | background s | waited s | steps beside | their mean s | slowdown |" in text
    assert "| 0 | 4 | 0.250 | - | 0.000 | 0 | - | - |" in text
    assert "| 1 | 6 | 0.010 | 0.500 | 0.020 | 2 | 0.3000 | 3.00x |" in text
    assert "Slowdown: the mean of the steps beside a background write over the segment's other steps." in text


def test_sync_saves_alone_say_nothing_of_a_slowdown():
    text = "\n".join(
        checkpoints([segment(0, [SaveRecord(4, 0.0, 0.2)], {0: 0.1, 1: 0.1})], VERIFY, "v.json", Path("."))
    )
    assert "| 0 | 4 | 0.200 | - |" in text and "Slowdown" not in text
