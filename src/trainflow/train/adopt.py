"""A run folder of trainflow before campaign records (record format 1) under today's: its checkpoint series was named by
the hash of everything training read, so any changed setting started a new one. The first segment to run adopts the
series the config names (legacy_series): it is renamed to the campaign's series, and the campaign, the series and
each completed segment (its kept summary and lineage line, train.kept) are recorded as a new run writes them, so
training goes on from its checkpoints and nothing trained is trained again. The workflow refuses, in one line, a
config that would leave such series behind and start afresh (check_legacy).

    python -c "from trainflow.config import compose; from trainflow.train.adopt import legacy_series; \
        print(legacy_series(compose('train_segment')))"
"""

from __future__ import annotations

import dataclasses
import logging
import os
from pathlib import Path

from trainflow.atomic import write_json
from trainflow.campaign.check import check_format, start_series
from trainflow.campaign.records import Lineage
from trainflow.config import TrainflowConfig
from trainflow.config.hashing import section, tree_hash
from trainflow.config.identity import branch_point
from trainflow.config.run_folder import RunFolder
from trainflow.config.schema import LrSchedule
from trainflow.energy.metrics import JobMetrics
from trainflow.errors import ConfigError
from trainflow.journal import Journal
from trainflow.records import read_record
from trainflow.train.summary import SegmentSummary

log = logging.getLogger(__name__)

LEGACY_READS = ("model", "data", "parallel", "optim", "train", "checkpoint", "cluster")
"""What training read in format 1, whose hash named its series."""


def legacy_series(cfg: TrainflowConfig) -> str:
    """The name trainflow before campaign records gave the config's checkpoint series: the hash of those sections as
    that release had them (each change of a field since undone here)."""
    tree = {s: section(cfg, s) for s in LEGACY_READS}
    train = tree["train"]
    del train["branch_from"]  # added since: at its default it changed nothing
    del tree["cluster"]["measured"]  # added since: the planner's labels of its inputs, which training never reads
    hardware = tree["cluster"]["hardware"]
    del hardware["symmetric_share"]  # added since: a planner's input, which training never reads
    del hardware["startup"]  # added since: the start-up's parts, a planner's input (startup_s stays as it was)
    del hardware["crc_gbps"]  # added since: a planner's input (a recovery from peers' CRC), which training never reads
    del tree["checkpoint"]["snapshot_steps"]  # added since: peer snapshots, off (0) by default
    optim = tree["optim"]
    if (optim["schedule"], optim["decay_steps"]) == (LrSchedule.COSINE, 0):  # added since: cosine was its only one
        for key in ("schedule", "decay_steps", "decay_shape"):  # (wsd names another series, as another lr does)
            del optim[key]
    if train["compile"] is None:  # was a bool, False by default: null (on only for fp8 on GPUs) reads as it did
        train["compile"] = cfg.train.compiled(cfg.cluster.runtime.device)
    return tree_hash(tree)


def legacy_folders(cfg: TrainflowConfig) -> list[str]:
    """The run's checkpoint series no campaign record names: those of trainflow before campaign records."""
    root = Path(RunFolder.of(cfg).checkpoints).parent
    if Path(RunFolder.of(cfg).campaign_record).exists() or not root.is_dir():
        return []
    return sorted(p.name for p in root.iterdir() if p.is_dir() and not (p / "series.json").exists())


def check_legacy(cfg: TrainflowConfig) -> None:
    """One ConfigError where the run folder holds series of trainflow before campaign records and the config names
    none of them: a new series would train from step 0 beside them."""
    found, mine = legacy_folders(cfg), legacy_series(cfg)
    if mine in found:
        check_format(RunFolder.of(cfg).series_checkpoints(mine))
    elif found and branch_point(cfg) is None:
        raise ConfigError(
            f"{RunFolder.of(cfg).root} holds checkpoint series of a trainflow before campaign records "
            f"({', '.join(found)}), none of them this config's ({legacy_series(cfg)}): run once with the settings "
            "the one to continue was trained with (its train/<series>/run.json), which adopts it, then change them; "
            "or move them out of the run folder to start the campaign afresh"
        )


def adopt_legacy(cfg: TrainflowConfig) -> bool:
    """Adopt the config's legacy series as the campaign's (module docstring); whether there was one."""
    run, old = RunFolder.of(cfg), legacy_series(cfg)
    source = Path(run.series_checkpoints(old))
    if old not in legacy_folders(cfg) or Path(run.checkpoints).exists():
        return False
    check_format(source)  # before anything moves
    os.rename(source, run.checkpoints)
    if Path(old_train := Path(run.train_dir).parent / old).is_dir():
        os.rename(old_train, run.train_dir)
    done = []
    for path in sorted(Path(run.train_dir).glob("segment-*.json")):
        if (segment := RunFolder.segment_of(path.name)) is not None and keep_legacy(cfg, segment, path, old):
            done.append(segment)
    start_series(cfg)
    log.warning(
        "Adopted the checkpoint series %s of a trainflow before campaign records as %s: segment(s) %s complete",
        *(old, run.series, ", ".join(map(str, done)) or "none"),
    )
    return True


def keep_legacy(cfg: TrainflowConfig, segment: int, path: Path, old: str) -> bool:
    """Keep a legacy segment's summary and metrics as train.kept does, with its lineage line; False where it had not
    completed."""
    summary = read_record(SegmentSummary, path, rerun=f"nothing: move {path} away to train the segment again")
    if not summary.completed:
        return False
    checkpoints = RunFolder.of(cfg).checkpoints
    lineage = Lineage(
        segment=segment,
        start_step=summary.start_step,
        end_step=summary.end_step,
        continued_from=f"series {old} of a trainflow before campaign records",
        code=None,
    )
    write_json(RunFolder.kept_summary(checkpoints, segment), dataclasses.replace(summary, lineage=lineage).to_json())
    metrics = Path(RunFolder.of(cfg).job_metrics("train_segment", segment=segment))
    if metrics.is_file():
        kept = read_record(JobMetrics, metrics, rerun=f"nothing: move {metrics} away")
        write_json(RunFolder.kept_metrics(checkpoints, segment), kept.to_json())
    Journal(RunFolder.lineage_log(checkpoints), Lineage).append(lineage)
    return True
