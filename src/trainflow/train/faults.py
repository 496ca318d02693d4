"""Failure drills (cfg.fault, in no config hash): the configured fault, injected where a real one would strike.

python -m trainflow.stages.train_segment fault.step=7 fault.rank=1 fault.signal=KILL   # a dead rank
"""

from __future__ import annotations

import logging
import os
import signal

import torch.distributed as dist

from trainflow.config import FaultConfig

log = logging.getLogger(__name__)


def maybe_inject_fault(fault: FaultConfig, step: int, *, during_save: bool) -> None:
    """The drill at this point: a signal at the start of fault.step on fault.rank, or (fault.during_save) that
    rank's death inside the checkpoint write of that step, after the shards and before the rename."""
    if step != fault.step or dist.get_rank() != fault.rank or during_save != fault.during_save:
        return
    what = "death during save" if during_save else f"SIG{fault.signal}"
    log.warning("Injected fault at step %d on rank %d: %s", step, fault.rank, what)
    if during_save:
        os._exit(3)
    os.kill(os.getpid(), getattr(signal, f"SIG{fault.signal}"))
