"""A replacement rank's entry point (resilience.recovery=peers): submitit's task runner on the failed step's folder, as
the global rank it replaces, which joins the step's next generation (launch.peers).

    TRAINFLOW_RANK_BASE=2 TRAINFLOW_WORLD=4 python -m trainflow.launch.rejoin FOLDER     # launch.peer_recovery does

srun numbers a replacement step's tasks from 0 (SLURM_PROCID), and submitit names a task's files and rank by it: this
adds the step's first global rank and sets the world size, so the task is the rank it replaces, in that rank's files.
One machine runs each replacement rank as a process of its own, SUBMITIT_LOCAL_GLOBALID its rank.
"""

from __future__ import annotations

import os
import sys

from submitit.core.submission import process_job

RANK_BASE = "TRAINFLOW_RANK_BASE"
WORLD = "TRAINFLOW_WORLD"


def renumbered(env: dict[str, str]) -> dict[str, str]:
    """The task's variables as the rank it replaces."""
    base, world = int(env[RANK_BASE]), env[WORLD]
    if "SLURM_PROCID" in env:
        return {"SLURM_PROCID": str(base + int(env["SLURM_PROCID"])), "SLURM_NTASKS": world}
    return {"SUBMITIT_LOCAL_GLOBALID": str(base), "SUBMITIT_LOCAL_NTASKS": world}


if __name__ == "__main__":
    os.environ.update(renumbered(dict(os.environ)))
    process_job(sys.argv[1])
