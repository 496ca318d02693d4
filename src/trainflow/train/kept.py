"""A completed segment's records, kept beside its checkpoints: its summary and job metrics (segments/), and its line
in the series' lineage (lineage.jsonl), written last: the segment is complete once its line is there. A rerun of a
complete segment (its workflow output deleted, a changed setting, a rerun of the DAG from another config) restores
its outputs from them and trains nothing, measures nothing and rewrites no measured file.

    python -c "from trainflow.config import compose; from trainflow.campaign.segments import lineage; \
        print(lineage(compose('train_segment').io.checkpoints))"
"""

from __future__ import annotations

import logging
from pathlib import Path

from trainflow.atomic import write_json
from trainflow.campaign.records import Lineage, StepChange
from trainflow.campaign.segments import SegmentSpan, start_point
from trainflow.code_version import CodeVersion
from trainflow.config import TrainflowConfig
from trainflow.config.run_folder import RunFolder
from trainflow.energy.metrics import JobMetrics
from trainflow.journal import Journal
from trainflow.records import read_record
from trainflow.train.summary import SegmentSummary

log = logging.getLogger(__name__)


def continued_from(cfg: TrainflowConfig, span: SegmentSpan) -> str:
    """What the segment's first step started from (campaign.records.Lineage.continued_from)."""
    if span.segment > 0:
        return f"{RunFolder.of(cfg).series}@{span.start}"
    if (point := start_point(cfg)) is not None:
        return f"{point[0]}@{point[1]}"
    if cfg.io.resume_from:
        return f"io.resume_from {cfg.io.resume_from}"
    if cfg.io.init_from:
        return f"io.init_from {cfg.io.init_from}"
    return f"random initialisation (train.seed {cfg.train.seed})"


def lineage_of(cfg: TrainflowConfig, span: SegmentSpan, summary: SegmentSummary) -> Lineage:
    """The lineage of a segment that completed at summary.end_step: its jobs' changes from changes.jsonl."""
    changed = Journal(RunFolder.changes_log(cfg.io.checkpoints), StepChange).read()
    return Lineage(
        segment=span.segment,
        start_step=span.start,
        end_step=summary.end_step,
        continued_from=continued_from(cfg, span),
        code=CodeVersion.here(),
        changes=[c for c in changed if c.segment == span.segment and span.start <= c.step <= summary.end_step],
    )


def keep_segment(cfg: TrainflowConfig, summary: SegmentSummary) -> None:
    """Keep a completed segment's summary (its lineage in it), then append its lineage line: now it is complete."""
    assert summary.lineage is not None
    write_json(RunFolder.kept_summary(cfg.io.checkpoints, cfg.segment), summary.to_json())
    Journal(RunFolder.lineage_log(cfg.io.checkpoints), Lineage).append(summary.lineage)


def restore_segment(cfg: TrainflowConfig, span: SegmentSpan) -> bool:
    """Restore a complete segment's workflow outputs from what was kept, each read back as its record first (the
    files may be hostile); its metrics where they were: False when its stage ended before writing them."""
    kept = Path(RunFolder.kept_summary(cfg.io.checkpoints, cfg.segment))
    lost = f"remove segment {cfg.segment}'s line from {RunFolder.lineage_log(cfg.io.checkpoints)} to train it again"
    summary = read_record(SegmentSummary, kept, rerun=f"nothing can write it again: {lost}")
    write_json(cfg.io.segment_report, summary.to_json())
    log.info(
        "Segment %d already complete at step %d: nothing to train (its summary restored from %s)",
        *(cfg.segment, span.end, kept),
    )
    metrics = Path(RunFolder.kept_metrics(cfg.io.checkpoints, cfg.segment))
    if not metrics.is_file():
        log.warning("Segment %d: its job's metrics were never kept (%s): this run's are recorded", cfg.segment, kept)
        return False
    write_json(cfg.io.job_metrics, read_record(JobMetrics, metrics, rerun=f"nothing: {lost}").to_json())
    return True
