"""Failure drills (cfg.fault, in no config hash): the configured fault, injected where a real one would strike.

python -m trainflow.stages.train_segment fault.step=7 fault.rank=1 fault.signal=KILL   # a dead rank
python -m trainflow.stages.train_segment fault.step=7 fault.rank=1 fault.signal=STOP   # a hung one
python -m trainflow.stages.train_segment fault.step=7 fault.rank=1 fault.signal=STALL  # its main thread stuck
python -m trainflow.stages.train_segment fault.step=7 fault.signal=WEDGE               # every rank in a collective
python -m trainflow.stages.train_segment fault.step=7 fault.rank=1 fault.signal=CUDA   # a device error raised
python -m trainflow.stages.train_segment fault.nan_step=7                              # a NaN loss (train.guard)
python -m trainflow.stages.train_segment fault.rank=1 fault.slow_ms=200                # a straggler
python -m trainflow.stages.train_segment fault.mtbf_s=60 fault.seed=3                 # failures at a rate
"""

from __future__ import annotations

import logging
import os
import signal
import threading
import time
from collections.abc import Iterable

import torch
import torch.distributed as dist

from trainflow.config import FaultConfig
from trainflow.resilience.arrivals import ArrivalKind, Arrivals

log = logging.getLogger(__name__)
NO_SIGNAL = ("STALL", "WEDGE", "CUDA")
"""The faults fault.signal names that are no signal (config.faults)."""
CUDA_ERRORS = (
    "CUDA error: an illegal memory access was encountered",
    "CUDA error: uncorrectable ECC error encountered",
)
"""What the CUDA drill raises, one per job in turn: torch's own messages (torch.AcceleratorError), whose traceback ends
in the same hints for every CUDA error."""
CUDA_HINTS = (
    "CUDA kernel errors might be asynchronously reported at some other API call, so the stacktrace below might be "
    "incorrect.\nFor debugging consider passing CUDA_LAUNCH_BLOCKING=1\nCompile with `TORCH_USE_CUDA_DSA` to enable "
    "device-side assertions.\n"
)


class InjectedDeviceError(RuntimeError):
    """The CUDA drill's error, worded as torch words a device's."""


def maybe_inject_fault(fault: FaultConfig, step: int, *, during_save: bool, attempt: int) -> None:
    """The drill at this point: a signal at the start of fault.step on fault.rank, or (fault.during_save) that
    rank's death inside the checkpoint write of that step, after the shards and before the rename. Only in the
    segment's first fault.strikes jobs (`attempt` counts them), in job k fault.stride steps later each: by default
    the job train_segment restarts meets no fault, as a transient failure would not strike twice."""
    everyone = fault.signal == "WEDGE" and not during_save
    if attempt >= fault.strikes or step != fault.step + attempt * fault.stride or during_save != fault.during_save:
        return
    if dist.get_rank() != fault.rank and not everyone:
        return
    what = "death during save" if during_save else fault.signal if fault.signal in NO_SIGNAL else f"SIG{fault.signal}"
    log.warning("Injected fault at step %d on rank %d: %s", step, dist.get_rank(), what)
    if during_save:
        os._exit(3)
    if fault.signal == "STALL":
        threading.Event().wait()  # the main thread never returns; the heartbeat's thread beats on
    elif fault.signal == "CUDA":
        raise InjectedDeviceError(f"{CUDA_ERRORS[attempt % len(CUDA_ERRORS)]}\n{CUDA_HINTS}")
    elif everyone:
        wedge()
    else:
        os.kill(os.getpid(), getattr(signal, f"SIG{fault.signal}"))


def maybe_arrive(arrivals: Arrivals | None, step: int) -> None:
    """Failures at a rate (fault.mtbf_s): the arrival due to this rank at this step boundary, if any, strikes as the
    KILL or STALL drill does (trainflow.resilience.arrivals)."""
    arrival = arrivals.due(step) if arrivals is not None else None
    if arrival is None:
        return
    log.warning("Injected failure at step %d on rank %d: %s (fault.mtbf_s)", step, arrival.rank, arrival.kind)
    if arrival.kind is ArrivalKind.STALL:
        threading.Event().wait()
    os.kill(os.getpid(), signal.SIGKILL)


def wedge() -> None:
    """Enter a collective that never completes, on every rank alike: each rank receives from its neighbour, which
    sends nothing (the collective timeout ends it, long after the heartbeat's threshold)."""
    rank, world = dist.get_rank(), dist.get_world_size()
    dist.recv(torch.zeros(1), src=(rank + 1) % world)


def maybe_poison(fault: FaultConfig, window: int, loss: torch.Tensor, parameters: Iterable[torch.nn.Parameter]) -> None:
    """The NaN drill: the loss and every gradient of the step that draws data window fault.nan_step become NaN, on
    every rank (a bad batch: a rollback that leaves its window out no longer meets it)."""
    if window != fault.nan_step:
        return
    log.warning("Injected NaN loss and gradients at data window %d", window)
    loss.fill_(float("nan"))
    for p in parameters:
        if p.grad is not None:
            p.grad.fill_(float("nan"))


def maybe_slow(fault: FaultConfig, parts: list[torch.nn.Module]) -> None:
    """The straggler drill: on fault.rank, every forward of the first model chunk first sleeps fault.slow_ms."""
    if fault.slow_ms and dist.get_rank() == fault.rank:
        parts[0].register_forward_pre_hook(lambda module, args: time.sleep(fault.slow_ms / 1e3))
