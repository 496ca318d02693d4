"""Whether a config may train in its run folder: the same model as the campaign there (its identity), the seed its
series draws with, a branch's starting checkpoint, and a series whose records this trainflow reads (a newer one's
format is refused: records.NewerFormatError). The workflow checks when it builds the DAG, train_segment again
before it submits anything; one ConfigError line names the field, both values and the fix.

    python -c "from trainflow.config import compose; from trainflow.campaign.check import check_campaign; \
        check_campaign(compose('train_segment', ['model.dim=256']))"
"""

from __future__ import annotations

import contextlib
import time
from pathlib import Path

from trainflow.atomic import write_json
from trainflow.campaign.records import CampaignRecord, Parent, SeriesRecord
from trainflow.campaign.segments import start_point
from trainflow.checkpoint.folders import list_steps, step_dir
from trainflow.checkpoint.manifest import ChecksumError, check_complete, read_manifest
from trainflow.code_version import CodeVersion
from trainflow.config.identity import SEED, identity, series_key
from trainflow.config.phases import CARRIED, phase_index
from trainflow.config.run_folder import RunFolder
from trainflow.config.schema import TrainflowConfig
from trainflow.errors import ConfigError
from trainflow.records import read_record

WRITTEN_BY = "train_segment (it writes the file when the campaign's first segment starts)"


def check_campaign(cfg: TrainflowConfig) -> None:
    """One ConfigError where the config would train another model under the run's name, draw a series with another
    seed, or branch from a checkpoint the campaign does not hold."""
    run = RunFolder.of(cfg)
    if Path(run.campaign_record).exists():
        campaign = read_record(CampaignRecord, run.campaign_record, rerun=WRITTEN_BY)
        mine, theirs = identity(cfg), campaign.identity
        if phase_index(cfg) > 0:  # a later phase may change what checkpoints carry (rotary scaling)
            mine, theirs = ({k: v for k, v in d.items() if k not in CARRIED} for d in (mine, theirs))
        differ = sorted((key not in mine or key not in theirs, key) for key in {*mine, *theirs})  # both sides' first
        for _, key in differ:
            if mine.get(key) != theirs.get(key):
                raise ConfigError(
                    f"{key}({mine.get(key)!r}) but campaign {cfg.run!r} trains {key}={campaign.identity.get(key)!r} "
                    f"({run.campaign_record}): its checkpoints are another model's; to train this one start a new "
                    f"campaign with run=<new name> (a branch, train.branch_from, keeps the model)"
                )
    point = start_point(cfg)
    if point is not None:
        check_branch_point(run, *point)
    check_format(run.checkpoints)
    series = Path(RunFolder.series_record(run.checkpoints))
    if series.exists():
        seed = read_record(SeriesRecord, series, rerun=WRITTEN_BY).seed
        if seed != cfg.train.seed:
            steps = ", ".join(map(str, list_steps(run.checkpoints)[-5:])) or "none yet"
            raise ConfigError(
                f"{SEED}({cfg.train.seed}) but series {run.series} of campaign {cfg.run!r} draws its data with "
                f"{SEED}={seed} ({series}); to train on with another seed branch from one of its checkpoints "
                f"(train.branch_from=<step>; newest: {steps}), or start a new campaign with run=<new name>"
            )


def check_format(checkpoints: str | Path) -> None:
    """The newest checkpoint's manifest is of a format this trainflow reads (records.NewerFormatError where not);
    damage is the trainer's to pass over, to the next older one, but a newer format it must not: it would train the
    newer one's steps again."""
    if steps := list_steps(checkpoints):
        with contextlib.suppress(ChecksumError):
            read_manifest(step_dir(checkpoints, steps[-1]))


def check_branch_point(run: RunFolder, parent: str, step: int) -> None:
    """The checkpoint a branch starts from: a complete one of a series of this campaign (its files' CRCs are checked
    as the branch's first job reads them)."""
    folder = Path(run.series_checkpoints(parent))
    steps = list_steps(folder)
    if step not in steps:
        have = ", ".join(map(str, steps[-8:])) or "none"
        raise ConfigError(
            f"train.branch_from({parent}@{step}): series {parent} holds no checkpoint of step {step} in {folder} (its "
            f"newest: {have}); branch from one of those"
        )
    try:
        check_complete(step_dir(folder, step), read_manifest(step_dir(folder, step)))
    except ChecksumError as err:
        raise ConfigError(f"train.branch_from({parent}@{step}) names a damaged checkpoint: {err}") from None


def start_series(cfg: TrainflowConfig) -> None:
    """Record the campaign and the series the config trains, where this is their first segment (after
    check_campaign)."""
    run = RunFolder.of(cfg)
    if not Path(run.campaign_record).exists():
        record = CampaignRecord(
            run=cfg.run,
            series=series_key(cfg),
            identity=identity(cfg),
            seed=cfg.train.seed,
            started=time.time(),
            code=CodeVersion.here(),
        )
        write_json(run.campaign_record, record.to_json())
    series = RunFolder.series_record(run.checkpoints)
    if not Path(series).exists():
        point = start_point(cfg)
        parent = Parent(*point) if point else None
        record = SeriesRecord(run.series, cfg.train.seed, parent, time.time(), phase=cfg.phase)
        write_json(series, record.to_json())
