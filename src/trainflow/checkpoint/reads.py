"""How many bytes this process has read from checkpoint files: every load adds its rank's (CheckpointManager.load, the
files its rank read: checkpoint.single_read's tally). A recovery from peers reads none (launch.peer_recovery counts
it from the ranks' task markers), which this counter shows.

    python -c "from trainflow.checkpoint.reads import checkpoint_bytes_read; print(checkpoint_bytes_read())"
"""

from __future__ import annotations

import threading

_lock = threading.Lock()
_read = 0


def count_read(nbytes: int) -> None:
    global _read
    with _lock:
        _read += nbytes


def checkpoint_bytes_read() -> int:
    return _read
