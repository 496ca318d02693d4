"""Which steps a segment trains: it starts where the segment before it ended (its lineage), a branch's first where the
branch starts, a later phase's first where its parent phase ended (start_point), and runs train.segment_steps as
configured now; so a campaign whose segment length changes keeps every step it trained, and the next segment begins at
the step the last one reached. A series continued by hand from another run's checkpoints (io.resume_from) numbers its
first segment as configured: segment k starts at k x segment_steps.

    python -c "from trainflow.config import compose; from trainflow.campaign.segments import segment_span; \
        print(segment_span(compose('train_segment', ['segment=1'])))"
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from trainflow.campaign.records import Lineage
from trainflow.config.identity import branch_point
from trainflow.config.phases import phase_index
from trainflow.config.run_folder import RunFolder
from trainflow.config.schema import TrainflowConfig
from trainflow.errors import ConfigError
from trainflow.journal import Journal


@dataclass(frozen=True)
class SegmentSpan:
    segment: int
    start: int
    """Its first step."""
    end: int
    """The step it ends at: start + train.segment_steps, or where it ended when it has completed."""
    horizon: int
    """The series' planned last step: this end and the segments still to come at train.segment_steps each (the
    learning rate's horizon, train.schedule)."""
    pinned: frozenset[int]
    """The checkpoints kept whatever checkpoint.keep says: every completed segment's end, and this one's."""
    done: Lineage | None
    """Its lineage, once it has completed (lineage.jsonl)."""


def lineage(checkpoints: str) -> dict[int, Lineage]:
    """The completed segments of a series, by number."""
    return {line.segment: line for line in Journal(RunFolder.lineage_log(checkpoints), Lineage).read()}


def start_point(cfg: TrainflowConfig) -> tuple[str, int] | None:
    """The checkpoint (series, step) the config's series starts from; None: it starts at step 0 (or io.init_from,
    io.resume_from). One ConfigError where a later phase's parent has not reached its last segment's end."""
    k = phase_index(cfg)
    if k == 0:
        return branch_point(cfg)
    phase, parent = cfg.phases[k], cfg.phases[k - 1]
    if phase.from_step:
        return parent.series, phase.from_step
    folder = RunFolder.of(cfg).series_checkpoints(parent.series)
    done = lineage(folder)
    last = parent.segments - 1
    if last not in done:
        raise ConfigError(
            f"phase {phase.name} starts from phase {parent.name}'s last checkpoint, but its segment {last} has not "
            f"completed in {folder}: train phase {parent.name} first (phase={parent.name})"
        )
    return parent.series, done[last].end_step


def carries_scaling(cfg: TrainflowConfig, series: str | None) -> bool:
    """Whether the checkpoints of `series` may load into the config's model with another rotary scaling: a later
    phase's parent's (config.phases.CARRIED)."""
    k = phase_index(cfg)
    return k > 0 and series == cfg.phases[k - 1].series


def segment_span(cfg: TrainflowConfig) -> SegmentSpan:
    """The steps of segment cfg.segment of the config's series; one ConfigError where the segment before it has not
    completed."""
    t, k, checkpoints = cfg.train, cfg.segment, cfg.io.checkpoints
    done = lineage(checkpoints)
    if k in done:
        start, end = done[k].start_step, done[k].end_step
    else:
        if k == 0:
            point = start_point(cfg)
            start = point[1] if point else 0
        elif k - 1 in done:
            start = done[k - 1].end_step
        elif cfg.io.resume_from:  # a series continued by hand from another's folder: segments as configured
            start = k * t.segment_steps
        else:
            raise ConfigError(
                f"segment {k} follows segment {k - 1}, which has not completed in {checkpoints} (no line for it in "
                f"{Path(RunFolder.lineage_log(checkpoints)).name}); train segment {k - 1} first"
            )
        end = start + t.segment_steps
    later = max(t.segments - k - 1, 0)
    return SegmentSpan(
        segment=k,
        start=start,
        end=end,
        horizon=end + later * t.segment_steps,
        pinned=frozenset({line.end_step for line in done.values()} | {end}),
        done=done.get(k),
    )
