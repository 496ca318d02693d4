"""Host-memory copies of a rank's checkpoint state (checkpoint.mode=async): what the writer process writes from.

    python -c "import torch; from trainflow.checkpoint.staging import Staging; s = Staging(torch.device('cpu')); \
        s.start({'w': torch.ones(4)}, deferred=set(), then=lambda: None); s.wait(); print(s.buffers)"

One buffer per tensor of the flattened state, allocated at the first save in shared memory (the writer process
maps it once; pinned on CUDA, so the device-to-host copies run at the link's speed) and refilled by every save:
one extra copy of the rank's state in host memory for the whole run (check_host_memory refuses async when the
node's ranks cannot hold it). Buffers are keyed by name, not by the tensor's storage as torch's StateDictStager
caches them: the step and the RNG state are fresh tensors at every save, and a storage-keyed cache would hand
the writer new shared memory each time.

Only the optimizer changes parameters and its moments between two steps, so those (`deferred`: nearly all the
bytes) are copied in the background, beside the next step's forward and backward, and every optimizer's step
waits for that copy first (CheckpointManager registers the hook); the rest (buffers such as FP8 amax histories,
which a step's backward updates, the step, the RNG state) are copied before `start` returns.
"""

from __future__ import annotations

import concurrent.futures
import os
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path

import torch
import torch.distributed as dist
from torch.cuda._pin_memory_utils import pin_memory, unpin_memory

from trainflow.errors import TrainflowError
from trainflow.host import hostname
from trainflow.tensors import local, storage_ptr


class StagingError(TrainflowError):
    """Async checkpoints whose staging copy would not fit in host memory."""


class Staging:
    """One rank's staging buffers, filled by `start`; `wait` returns once they hold the state it was given."""

    def __init__(self, device: torch.device) -> None:
        self.device = device
        self.buffers: dict[str, torch.Tensor] = {}
        self.copier = ThreadPoolExecutor(max_workers=1, thread_name_prefix="trainflow-stage")
        self.copying: Future | None = None
        self.stream = torch.cuda.Stream(device) if device.type == "cuda" else None

    def allocate(self, flat: dict[str, torch.Tensor]) -> None:
        """Buffers shaped like this rank's parts of `flat` (strides kept, so DCP writes them as it would the live
        tensors), in shared memory, pinned on CUDA."""
        self.release()
        for key, t in flat.items():
            buf = torch.empty_like(local(t), device="cpu").share_memory_()
            if self.stream is not None and buf.nbytes:
                pin_memory(buf.data_ptr(), buf.untyped_storage().nbytes())
            self.buffers[key] = buf

    def start(self, flat: dict[str, torch.Tensor], *, deferred: set[int], then: Callable[[], None]) -> None:
        """Copy `flat` into the buffers: tensors whose storage is not in `deferred` now, the others in the
        background, after which `then` runs there (the hand-off to the writer process)."""
        now = [k for k, t in flat.items() if storage_ptr(t) not in deferred]
        later = [k for k in flat if k not in set(now)]
        self.copy(flat, now)
        if self.stream is not None:
            self.stream.wait_stream(torch.cuda.current_stream(self.device))
        self.copying = self.copier.submit(self._copy_later, flat, later, then)

    def copy(self, flat: dict[str, torch.Tensor], keys: list[str]) -> None:
        cuda = self.stream is not None
        for key in keys:
            self.buffers[key].copy_(local(flat[key]).detach(), non_blocking=cuda)
        if cuda:
            torch.cuda.current_stream(self.device).synchronize()

    def _copy_later(self, flat: dict[str, torch.Tensor], keys: list[str], then: Callable[[], None]) -> None:
        if self.stream is None:
            self.copy(flat, keys)  # copy_ releases the GIL: the training thread runs on beside it
        else:
            with torch.cuda.stream(self.stream):
                for key in keys:
                    self.buffers[key].copy_(local(flat[key]).detach(), non_blocking=True)
            self.stream.synchronize()
        then()

    def wait(self) -> None:
        """Block until the buffers hold the state last given to `start` (and its hand-off ran); raises what it
        raised."""
        if self.copying is not None:
            self.copying.result()

    def settle(self) -> None:
        """Block as `wait` does, but raise nothing: an optimizer's step waits here, and a failed copy is the next
        step boundary's to report, on every rank at once."""
        if self.copying is not None:
            concurrent.futures.wait([self.copying])

    def release(self) -> None:
        if self.stream is not None:
            for buf in self.buffers.values():
                if buf.nbytes:
                    unpin_memory(buf.data_ptr())
        self.buffers = {}

    def close(self) -> None:
        self.copier.shutdown(wait=True)
        self.release()


CGROUP_FILES = {"": ("memory.max", "memory.current"), "memory": ("memory.limit_in_bytes", "memory.usage_in_bytes")}
"""Limit and usage of a cgroup's memory: cgroup v2 (hierarchy "") and v1's memory controller."""


def available_host_bytes() -> tuple[int, str]:
    """What this host can still give this process: MemAvailable, or less where its cgroup or one above it (Slurm's
    --mem) allows less; and which of the two it is."""
    with open("/proc/meminfo") as f:
        meminfo = {line.split(":")[0]: int(line.split()[1]) * 1024 for line in f}
    available, source = meminfo["MemAvailable"], "MemAvailable"
    with open("/proc/self/cgroup") as f:
        groups = [line.rstrip("\n").split(":", 2)[1:] for line in f]
    for controller, path in groups:
        if controller not in CGROUP_FILES:
            continue
        group = Path("/sys/fs/cgroup", controller, path.lstrip("/"))
        for folder in (group, *group.parents):
            limit_file, usage_file = CGROUP_FILES[controller]
            try:
                limit, used = (folder / limit_file).read_text().strip(), int((folder / usage_file).read_text())
            except (OSError, ValueError):
                continue
            if limit.isdigit() and int(limit) - used < available:
                available, source = int(limit) - used, f"{folder / limit_file}"
            if folder == Path("/sys/fs/cgroup"):
                break
    return available, source


ASYNC_NEEDS = "checkpoint.mode=async stages a copy of every rank's state in host memory"
ASYNC_FIX = (
    "set checkpoint.mode=sync, or give the job more host memory (cluster.allocation.mem_gb) or fewer ranks per node"
)


def check_host_memory(staging_bytes: int, *, needs: str = ASYNC_NEEDS, fix: str = ASYNC_FIX) -> None:
    """At start-up, on every rank (collective): refuse what `needs` says, in one line on every rank ending in `fix`,
    when the ranks of some host cannot each hold `staging_bytes` more (async checkpoints' staging by default)."""
    host = hostname()
    hosts: list[str] = [""] * dist.get_world_size()
    dist.all_gather_object(hosts, host)
    ranks = hosts.count(host)
    available, source = available_host_bytes()
    verdict = None
    if ranks * staging_bytes > available:
        verdict = (
            f"{needs}: {ranks} ranks x {staging_bytes / 1e9:.3g} GB on {host} need {ranks * staging_bytes / 1e9:.3g} "
            f"GB, but {source} leaves {available / 1e9:.3g} GB (pid {os.getpid()}); {fix}"
        )
    verdicts: list[str | None] = [None] * dist.get_world_size()
    dist.all_gather_object(verdicts, verdict)
    if refused := next((v for v in verdicts if v), None):
        raise StagingError(refused)
