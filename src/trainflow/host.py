"""This process's node, as the job's records name it (layer 1: the energy windows, the launcher's task markers and
heartbeats, the stragglers' timing and the validate_nccl facts all say the same name for a host).

    python -c "from trainflow.host import hostname; print(hostname())"
"""

from __future__ import annotations

import os
import socket


def hostname() -> str:
    """Slurm's name for this node where it has one (what sinfo and the task markers say), else the host's."""
    return os.environ.get("SLURMD_NODENAME") or socket.gethostname()
