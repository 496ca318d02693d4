"""Step timing: where a step's seconds went (compute, exposed DP comm, pipeline bubble, activations).

clock = PipelineClock(exchange_s=probe_exchange_seconds(mesh["pp"], shape, device=device), exchanges=2 * v * m)
add_compute_timers(stages, clock)  # each step: clock.compute_s = 0.0, run it, clock.step_times(seconds)
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from statistics import median

import torch
import torch.distributed as dist
from torch.distributed.device_mesh import DeviceMesh


@dataclass
class StepTimes:
    """Seconds of one step, split as the seed's profile is: compute, exposed DP comm, bubble, activations."""

    compute: float = 0.0
    dp_comm: float = 0.0
    bubble: float = 0.0
    """Time in the pipeline schedule neither computing nor moving activations: idle wait."""
    activation: float = 0.0
    """Activation/gradient send/recv between stages: 2 x v x m exchanges at the probed time each."""


@dataclass
class PipelineClock:
    """The compute this rank's pipeline stages did in the current step, and the probed cost of its exchanges."""

    exchange_s: float = 0.0
    """Measured seconds of one activation exchange with the pipeline neighbours (probe at build time)."""
    exchanges: int = 0
    """Exchanges per step, 2 x v x m: each chunk sends an activation forward and a gradient back per microbatch."""
    compute_s: float = 0.0
    """Seconds inside the stages' forward/backward since the last reset (add_compute_timers adds to it)."""

    def step_times(self, schedule_s: float) -> StepTimes:
        """Split the schedule's wall time: torch's schedules hide their p2p waits, so what is not compute
        is split with the probed cost of the exchanges a step makes; the rest is bubble."""
        waiting = max(schedule_s - self.compute_s, 0.0)
        activation = min(self.exchanges * self.exchange_s, waiting)
        return StepTimes(compute=self.compute_s, bubble=waiting - activation, activation=activation)


def median_seconds(
    run: Callable[[], None], *, group: dist.ProcessGroup, iters: int, device: torch.device, warmup: int = 1
) -> float:
    """Median seconds of `run()` over `iters` calls, each started together on the group's ranks (a barrier) and
    finished on the device; `warmup` calls first (connection setup). The one timing loop of the gate's patterns,
    its sweep and the pipeline's exchange probe."""
    for _ in range(warmup):
        run()
    times = []
    for _ in range(iters):
        dist.barrier(group=group)
        start = time.perf_counter()
        run()
        if device.type == "cuda":
            torch.cuda.synchronize()
        times.append(time.perf_counter() - start)
    return median(times)


def probe_exchange_seconds(
    pp_mesh: DeviceMesh, shape: tuple[int, ...], *, device: torch.device, iters: int = 5
) -> float:
    """Median seconds to send one activation to the next stage while receiving one from the previous."""
    group = pp_mesh.get_group()
    rank, size = pp_mesh.get_local_rank(), pp_mesh.size()
    send, recv = torch.zeros(shape, device=device), torch.empty(shape, device=device)
    peers = [dist.get_global_rank(group, (rank + d) % size) for d in (1, -1)]

    def exchange() -> None:
        ops = [dist.P2POp(dist.isend, send, peers[0], group), dist.P2POp(dist.irecv, recv, peers[1], group)]
        for work in dist.batch_isend_irecv(ops):
            work.wait()

    return median_seconds(exchange, group=group, iters=iters, device=device, warmup=0)


def add_compute_timers(stages: list, clock: PipelineClock) -> None:
    """Accumulate the forward and backward compute of this rank's pipeline stages into clock.compute_s.

    Wraps PipelineStage.forward_one_chunk / backward_one_chunk, which every schedule calls and
    which do no communication; module backward hooks would miss the first stage, whose inputs
    (token ids) need no gradient."""

    def timed(method):
        def wrapper(*args, **kwargs):
            start = time.perf_counter()
            try:
                return method(*args, **kwargs)
            finally:
                clock.compute_s += time.perf_counter() - start

        return wrapper

    for info in stages:
        info.stage.forward_one_chunk = timed(info.stage.forward_one_chunk)
        info.stage.backward_one_chunk = timed(info.stage.backward_one_chunk)
