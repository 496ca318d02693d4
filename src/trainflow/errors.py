"""The root of trainflow's expected failures: each is one line naming the value and the fix.

A stage catches TrainflowError, logs its line and exits 1 (trainflow.stage.run_stage); anything else
is a bug and keeps its traceback.
"""


class TrainflowError(Exception):
    """An expected failure: bad config, data, checkpoint or signal. One line naming the value and the fix."""


class ConfigError(TrainflowError, ValueError):
    """A configuration that cannot run."""
