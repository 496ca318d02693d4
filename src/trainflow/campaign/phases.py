"""Where a series starts: a branch at its checkpoint (train.branch_from), a later phase at its parent phase's last
checkpoint, read from the parent's lineage when the phase trains (or at phases[].from_step), or at step 0.

    python -c "from trainflow.config import compose; from trainflow.campaign.phases import start_point; \
        print(start_point(compose('train_segment', ['phase=long'])))"
"""

from __future__ import annotations

from trainflow.campaign.records import Lineage
from trainflow.config.identity import branch_point
from trainflow.config.phases import phase_index
from trainflow.config.run_folder import RunFolder
from trainflow.config.schema import TrainflowConfig
from trainflow.errors import ConfigError
from trainflow.journal import Journal


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
    done = {line.segment: line for line in Journal(RunFolder.lineage_log(folder), Lineage).read()}
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
