"""One badput taxonomy for the plan and the report: where a campaign's wall time goes that is not its kept steps, in
the categories the planner's closed form (trainflow.plan.failures), a run's planned-against-measured terms
(trainflow.plan.from_run, trainflow.train.run_terms) and the report's tables all name, each mapped to Google's
ml-goodput-measurement BadputType where one maps, and each measured term of a segment's wall time
(resilience.goodput.TERMS) to the category it counts in.

    python -c "from trainflow.badput import Badput, GOODPUT_MEASUREMENT; \
        print({b.value: GOODPUT_MEASUREMENT[b] for b in Badput})"
"""

from __future__ import annotations

from enum import StrEnum


class Badput(StrEnum):
    CHECKPOINT = "checkpoint"
    """The step loop blocked for a save (the interval's saves: a segment's last save is a start-up's)."""
    LOST_WORK = "lost work"
    """Steps and evaluations redone after a failure or a rollback, and steps the loss guard did not apply."""
    DETECTION = "detection"
    """From a failure to the failed job's end: the lost partial step and the wait until every rank ended."""
    RESTART = "restart"
    """From a failed job's end to the first step after it: the verdict, the hosts' check, the queue, the start-up and
    the checkpoint load of the job or step that continues."""
    START_UP = "start-up"
    """Every planned job's queue, start-up, load, last save and shutdown, and the gaps inside jobs: what a campaign
    without failures pays for being cut into jobs."""
    EVALUATION = "evaluation"
    """Validation passes of the training ranks (train.eval_every)."""


GOODPUT_MEASUREMENT: dict[Badput, str] = {
    Badput.CHECKPOINT: "UNPRODUCTIVE_CHECKPOINT_SAVE_TIME",
    Badput.LOST_WORK: "WASTED_PROGRESS_FROM_DISRUPTION",
    Badput.DETECTION: "INFRASTRUCTURE_RECOVERY_FROM_DISRUPTION",
    Badput.RESTART: "INFRASTRUCTURE_RECOVERY_FROM_DISRUPTION + UNPRODUCTIVE_CHECKPOINT_RESTORE_TIME",
    Badput.START_UP: "PROGRAM_STARTUP + TRAINING_PREP + UNPRODUCTIVE_CHECKPOINT_RESTORE_TIME",
    Badput.EVALUATION: "CUSTOM_BADPUT_EVENTS",
}
"""ml-goodput-measurement's BadputType each category holds (it has no category for detection, which it counts in
the recovery; DATA_LOADING_SYNC has none here: trainflow's loader is inside the step)."""

MEASURED: dict[str, Badput | None] = {
    "productive": None,
    "evaluation": Badput.EVALUATION,
    "checkpoint": Badput.CHECKPOINT,
    "load": Badput.START_UP,
    "recomputed": Badput.LOST_WORK,
    "skipped": Badput.LOST_WORK,
    "queue": Badput.START_UP,
    "start-up": Badput.START_UP,
    "detection": Badput.DETECTION,
    "shutdown": Badput.START_UP,
    "restart": Badput.RESTART,
    "other": Badput.START_UP,
}
"""Each measured term of a segment's wall time (resilience.goodput.TERMS) -> its category (None: goodput). A job that
follows a failure moves its queue, start-up and load from start-up to restart (train.run_terms), which one term's
name cannot say."""
