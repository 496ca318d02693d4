"""The controller of a local job: executors.LocalExecutor starts `python -m trainflow.launch FOLDER`."""

import sys
from pathlib import Path

from trainflow.launch.executors import LocalController

LocalController(Path(sys.argv[1])).run()
