"""One module per stage, each run as `python -m trainflow.stages.<stage> [OVERRIDE ...]` (trainflow.stage.stage_main).

Run so, Python imports this package before the stage's module, and the package composes the stage's config from the
command line first (trainflow.stage.check_command_line): a bad override fails in one line in about a second, before
train_segment's imports load torch (~10 s). Imported any other way, the package does nothing.
"""

from trainflow.stage import check_command_line

check_command_line()
