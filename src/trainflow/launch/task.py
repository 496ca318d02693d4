"""What each task of a job does first: mark where it runs, join the default process group.

with distributed_task(cfg.cluster.runtime) as (rank, world_size, device, marker): ...   # inside a submitit task
"""

from __future__ import annotations

import contextlib
import dataclasses
import datetime
import logging.config
import os
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

import submitit
import yaml
from submitit.core.utils import JobPaths

from trainflow.atomic import write_json
from trainflow.checkpoint.reads import checkpoint_bytes_read
from trainflow.config import CONF_DIR, RuntimeConfig
from trainflow.config.startup import StartupPart
from trainflow.errors import TrainflowError
from trainflow.host import hostname
from trainflow.launch.hang import rank_environment
from trainflow.launch.node_report import write_node_report
from trainflow.records import Record, RecordError, fields_added, read_record
from trainflow.resilience.verdict import DEVICE_FAULT, NETWORK_FAULT

if TYPE_CHECKING:
    import torch


MASTER_ADDR = "TRAINFLOW_MASTER_ADDR"
"""A hot restart's job step's first node, where its rank 0 serves the rendezvous (launch.supervisor sets it): submitit
takes the address from SLURM_JOB_NODELIST, which lists the whole allocation, whose first node a step may leave out."""


@dataclass(frozen=True)
class TaskMarker(Record):
    """Where a task ran and how its code ended (<job>_<task>_task.json in the job's folder): written by marked_task
    as the task starts and again as its code ends, read by launch.failure and train_segment's jobs ledger."""

    FORMAT = 3
    MIGRATIONS = {1: fields_added, 2: fields_added}  # 2: parts; 3: checkpoint_bytes

    rank: int
    host: str
    pid: int
    started: float
    """Wall-clock time (time.time()) the task's code began."""
    ended: float | None = None
    """When its code ended, returning or raising; None: it has not, or it died abruptly (a signal, os._exit, the
    OOM killer)."""
    error: str | None = None
    """The type of the exception it raised; None: it did not raise."""
    expected: bool = False
    """It raised one of trainflow's own errors (TrainflowError), which launch.restart does not retry."""
    step: int | None = None
    """The step a training rank was at when it raised (train_segment; launch.restart's out of memory twice)."""
    first_step: float | None = None
    """When the rank's first trained step ended (time.time(); launch.heartbeat writes it then): a hot restart's
    failure-to-first-step time (launch.supervisor)."""
    parts: dict[str, float] = field(default_factory=dict)
    """When each part of the rank's start-up before its first step ended (time.time()), by config.startup.StartupPart:
    launch (the process's start), imports (the task's code running), rendezvous, communicators, build, load; the
    first step's end is `first_step`. A part the rank did not reach, or could not record, is absent."""
    checkpoint_bytes: int = 0
    """Bytes the process had read from checkpoint files when its latest first step ended (a recovery from peers reads
    none: launch.peer_recovery)."""


@dataclass
class TaskNotes:
    """What the block inside marked_task adds to its marker as it ends."""

    step: int | None = None


def task_marker(paths: JobPaths) -> Path:
    """The task's marker (TaskMarker)."""
    return paths.folder / f"{paths.job_id}_{paths.task_id}_task.json"


def read_marker(path: Path) -> TaskMarker:
    """The TaskMarker in `path`; one RecordError naming the file and field if it is not one."""
    return read_record(TaskMarker, path, rerun="the job (the marker was altered)")


def mark_first_step(paths: JobPaths) -> None:
    """Record in this task's marker that its first trained step has just ended (called from the task's main thread,
    as marked_task's own writes are)."""
    path = task_marker(paths)
    if path.exists():
        read = checkpoint_bytes_read()
        marker = dataclasses.replace(read_marker(path), first_step=time.time(), checkpoint_bytes=read)
        write_json(path, marker.to_json())


def mark_part(paths: JobPaths, part: StartupPart) -> None:
    """Record in this task's marker that `part` of its start-up has just ended (from the task's main thread). A
    record that fails is left out: the start-up's figures never stop training."""
    path, now = task_marker(paths), time.time()
    with contextlib.suppress(OSError, RecordError):
        marker = read_marker(path)
        write_json(path, dataclasses.replace(marker, parts={**marker.parts, part.value: now}).to_json())


def process_start() -> float | None:
    """When this process started (time.time()): its start in clock ticks after boot (/proc/self/stat) placed on the
    wall clock by the uptime now; None where /proc cannot say (not Linux)."""
    with contextlib.suppress(OSError, ValueError, IndexError):
        now, uptime = time.time(), float(Path("/proc/uptime").read_text().split()[0])
        ticks = int(Path("/proc/self/stat").read_text().rpartition(")")[2].split()[19])  # field 22, starttime
        return now - uptime + ticks / os.sysconf("SC_CLK_TCK")
    return None


@contextlib.contextmanager
def marked_task() -> Iterator[TaskNotes]:
    """Record in this task's marker where it runs and, when the block ends (returning or raising), that its code
    ended: a rank of a failed job whose marker lacks the end died abruptly. A raise records whether it was one of
    trainflow's own errors (resilience.verdict does not retry those); a device or interconnect error writes the host's
    node report too (launch.node_report). The block may note the step a training rank was at in the notes it is
    given."""
    env, started, launched = submitit.JobEnvironment(), time.time(), process_start()
    parts = ({} if launched is None else {StartupPart.LAUNCH.value: launched}) | {StartupPart.IMPORTS.value: started}
    marker = TaskMarker(rank=env.global_rank, host=hostname(), pid=os.getpid(), started=started, parts=parts)
    write_json(task_marker(env.paths), marker.to_json())
    notes = TaskNotes()
    try:
        yield notes
    except BaseException as err:
        marker = dataclasses.replace(marker, error=type(err).__name__, expected=isinstance(err, TrainflowError))
        if DEVICE_FAULT.search(text := f"{type(err).__name__}: {err}") or NETWORK_FAULT.search(text):
            with contextlib.suppress(OSError):  # best effort: the rank's own error is what it ends with
                write_node_report(env.paths)  # its host's word, for the verdict (launch.judgement)
        raise
    finally:
        written = read_marker(task_marker(env.paths))  # the block's marks: its parts, its first step if it trained one
        ended = dataclasses.replace(
            marker,
            ended=time.time(),
            step=notes.step,
            first_step=written.first_step,
            parts=written.parts,
            checkpoint_bytes=written.checkpoint_bytes,
        )
        write_json(task_marker(env.paths), ended.to_json())


def configure_logging() -> None:
    """The stages' log lines in a task too: Hydra's job_logging config of the stage process, applied here."""
    logging.config.dictConfig(yaml.safe_load((CONF_DIR / "hydra/job_logging/trainflow.yaml").read_text()))


@contextlib.contextmanager
def distributed_task(runtime: RuntimeConfig) -> Iterator[tuple[int, int, torch.device, TaskNotes]]:
    """Rank, world size and device of this task inside the default process group, in a marked task (and the
    marker's notes, which the block may add to)."""
    # Imported here, not at the top: the local controller (`python -m trainflow.launch`) imports this package
    # and would wait 3 s for torch.
    import torch.distributed as dist

    configure_logging()
    with marked_task() as marker:
        env = submitit.helpers.TorchDistributedEnvironment()
        env.master_addr = os.environ.get(MASTER_ADDR, env.master_addr)
        device = task_device(runtime, env)
        backend = runtime.backend
        dist.init_process_group(
            backend=backend,
            timeout=datetime.timedelta(seconds=runtime.collective_timeout_s),
            device_id=device if backend == "nccl" else None,
        )
        mark_part(submitit.JobEnvironment().paths, StartupPart.RENDEZVOUS)
        try:
            yield env.rank, env.world_size, device, marker
        finally:
            dist.destroy_process_group()


def task_device(runtime: RuntimeConfig, env: submitit.helpers.TorchDistributedEnvironment) -> torch.device:
    """This task's device, once its rank's variables are set (the Flight Recorder's, torch.distributed's RANK,
    WORLD_SIZE, LOCAL_RANK and the rendezvous address)."""
    import torch

    os.environ.update(rank_environment(runtime, submitit.JobEnvironment().paths))
    env.export(set_cuda_visible_devices=False)
    if runtime.device != "cuda":
        return torch.device("cpu")
    device = torch.device("cuda", env.local_rank)
    torch.cuda.set_device(device)
    return device
