"""A hung job's diagnosis and its evidence, beside the job's logs: the report the detecting rank writes, every live
rank's Python stacks and PyTorch's Flight Recorder, and the one line the stage fails with.

    <submitit folder>/<job>_hang.json          HangReport (launch.heartbeat's verdict)
    <submitit folder>/<job>_<rank>_stacks.txt  faulthandler's dump of every thread of that rank (StacksWatchdog)
    <submitit folder>/<job>_<rank>_flight.json torch's Flight Recorder of that rank
    <submitit folder>/<job>_<rank>_flight.pkl  the same as a pickle, for torch's fr_trace (NCCL only)
    <submitit folder>/<job>_<rank>_flight_newest.json  its newest collective per group (what resilience.flight reads)
    <submitit folder>/<job>_nccl_trace_rank_<rank>  the same, dumped by torch's watchdog on a collective timeout
"""

from __future__ import annotations

import contextlib
import faulthandler
import json
import os
import sys
import threading
import traceback
from pathlib import Path

from submitit.core.utils import JobPaths

from trainflow.atomic import atomic_path, write_json
from trainflow.config import RuntimeConfig
from trainflow.records import RecordError, read_record
from trainflow.resilience.flight import newest_rows
from trainflow.resilience.hang import HangReport

HANG_EXIT = 86
"""The exit status of a rank that left a hung job (ranks end themselves: a launcher cannot see a hang)."""


FLIGHT_RECORDER = {
    "TORCH_FR_BUFFER_SIZE": "20000",
    "TORCH_NCCL_TRACE_BUFFER_SIZE": "20000",
    "TORCH_NCCL_DUMP_ON_TIMEOUT": "1",
}
"""PyTorch's Flight Recorder, on by default (its buffer is 0, the recorder off, unless set): the last 20000 collectives
of every process group, as torchtitan keeps them; over NCCL also dumped by the watchdog on a collective timeout
(TORCH_FR_BUFFER_SIZE from torch 2.7, TORCH_NCCL_TRACE_BUFFER_SIZE before; both set). gloo records into the same
buffer. cluster.runtime.env overrides each."""


def rank_environment(runtime: RuntimeConfig, paths: JobPaths) -> dict[str, str]:
    """The variables a rank sets before torch.distributed starts: the Flight Recorder's buffer, over NCCL its dump on
    a timeout beside the job's logs too, then cluster.runtime.env, which overrides them."""
    recorder = {"TORCH_FR_BUFFER_SIZE": FLIGHT_RECORDER["TORCH_FR_BUFFER_SIZE"]}  # gloo records too (torch >= 2.8)
    if runtime.backend == "nccl":
        dumps = str(paths.folder / f"{paths.job_id}_nccl_trace_rank_")  # torch appends the rank
        recorder = FLIGHT_RECORDER | {"TORCH_NCCL_DEBUG_INFO_TEMP_FILE": dumps}
    return recorder | dict(runtime.env)


def report_path(paths: JobPaths) -> Path:
    return paths.folder / f"{paths.job_id}_hang.json"


def stacks_path(paths: JobPaths, rank: int) -> Path:
    return paths.folder / f"{paths.job_id}_{rank}_stacks.txt"


def write_report(paths: JobPaths, report: HangReport) -> bool:
    """Write the job's diagnosis unless a rank wrote one first (False then). The first verdict is the one to keep: on
    Slurm a stopped rank is sent SIGCONT before it is killed, and would judge the detecting rank, gone by then, hung."""
    path = report_path(paths)
    tmp = path.with_name(f"{path.name}.{os.getpid()}.tmp")
    write_json(tmp, report.to_json())
    try:
        os.link(tmp, path)  # atomic, and fails where the file exists: the first writer wins
    except FileExistsError:
        return False
    finally:
        tmp.unlink(missing_ok=True)
    return True


def read_report(paths: JobPaths) -> HangReport | None:
    """The job's hang report, None when it has none (or one that does not read: the plain failure line stands)."""
    path = report_path(paths)
    if not path.is_file():
        return None
    with contextlib.suppress(RecordError):
        return read_record(HangReport, path)
    return None


def waiting_in(thread: threading.Thread) -> str:
    """Where `thread` waits: its innermost torch.distributed function (else its innermost torch function: DDP's
    gradient all-reduce waits inside autograd's backward) and the innermost trainflow frame that called it, e.g.
    "all_reduce (trainflow/parallel/runtime.py:161, clip_grad_norm)"."""
    frame = sys._current_frames().get(thread.ident)  # the documented way to see another thread's stack
    if frame is None:
        return "nothing (its main thread had ended)"
    stack = traceback.extract_stack(frame)
    torch_frames = [f for f in stack if "/torch/" in f.filename]
    call = next((f for f in reversed(torch_frames) if "/torch/distributed/" in f.filename), None)
    call = call or next(iter(torch_frames[-1:]), None)
    ours = next((f for f in reversed(stack) if "/trainflow/" in f.filename), None)
    where = f"{ours.filename.split('/src/')[-1]}:{ours.lineno}, {ours.name}" if ours else "outside trainflow"
    if call is None:
        return f"no torch call ({where})"
    module = call.filename.split("/torch/")[-1].removesuffix(".py").replace("/", ".").removesuffix(".__init__")
    return f"torch.{module}.{call.name} ({where})"


class StacksWatchdog:
    """A rank's stacks written by faulthandler's own C thread where the heartbeat's thread cannot run: a main thread
    stuck in a C call that holds the GIL stops every Python thread, so the abort that dumps the others' stacks never
    runs on it. The heartbeat re-arms it every beat; a beat that does not come for `arm`'s timeout writes every
    thread's stack into the rank's stacks file without the GIL. That timeout is the hang threshold and two beats: it
    never fires while the heartbeat beats (it walks running threads, which can crash them), and fires before rank 0,
    which judges this rank silent past the threshold and then waits three beats for the others' stacks, ends the job.
    A stopped process (SIGSTOP) stops this thread too: its file stays empty. The file is open from the start
    (faulthandler writes to an open descriptor) and removed at a clean end when nothing was written."""

    def __init__(self, paths: JobPaths, rank: int) -> None:
        self.path = stacks_path(paths, rank)
        self.file = open(self.path, "w")  # noqa: SIM115 (held open for faulthandler's thread until close)

    def arm(self, timeout_s: float) -> None:
        faulthandler.dump_traceback_later(timeout_s, file=self.file)  # cancels the previous one

    def cancel(self) -> None:
        faulthandler.cancel_dump_traceback_later()

    def close(self) -> None:
        self.cancel()
        self.file.close()
        if self.path.is_file() and self.path.stat().st_size == 0:
            self.path.unlink()


def flight_path(paths: JobPaths, rank: int) -> Path:
    return paths.folder / f"{paths.job_id}_{rank}_flight.json"


def digest_path(paths: JobPaths, rank: int) -> Path:
    return paths.folder / f"{paths.job_id}_{rank}_flight_newest.json"


def dump_stacks(paths: JobPaths, rank: int, *, nccl: bool) -> None:
    """Every thread's Python stack of this rank and its Flight Recorder as JSON (any backend: resilience.flight reads
    them side by side), and over NCCL the recorder's pickle as well, for torch's own fr_trace; beside the job's logs."""
    with atomic_path(stacks_path(paths, rank)) as tmp, open(tmp, "w") as f:
        faulthandler.dump_traceback(file=f, all_threads=True)
    import torch

    c10d = torch._C._distributed_c10d  # the recorder's dumps have no public wrapper (torchtitan calls these too)
    if dump := getattr(c10d, "_dump_fr_trace_json", None):  # a torch without it: the stacks and counts stand alone
        with contextlib.suppress(Exception), atomic_path(flight_path(paths, rank)) as tmp:
            text = dump(True, True)  # with the collectives' entries, of the groups still alive
            tmp.write_bytes(text if isinstance(text, bytes) else text.encode())
        with contextlib.suppress(Exception), atomic_path(digest_path(paths, rank)) as tmp:
            tmp.write_text(json.dumps(newest_rows(json.loads(text))))  # what the analysis reads at scale
    if nccl:  # PyTorch's Flight Recorder: the last collectives of every process group, as torchtitan dumps them
        with contextlib.suppress(Exception), atomic_path(paths.folder / f"{paths.job_id}_{rank}_flight.pkl") as tmp:
            tmp.write_bytes(c10d._dump_nccl_trace())


POINT_TO_POINT = frozenset({"mesh_pp"})
"""Process-group descriptions (DeviceMesh's `mesh_<dim>`) whose members' counts differ in normal running: pipeline
groups' sends and receives count on the two ranks of each transfer only."""


def collective_counts() -> dict[str, int]:
    """This rank's count of entered collectives per process group it belongs to (pipeline groups left out); {} before
    torch.distributed is set up. Read from the heartbeat's thread while the main thread may be creating groups."""
    import torch.distributed as dist

    if not dist.is_initialized():
        return {}
    world = dist.distributed_c10d._world  # the registry of process groups; no public accessor lists them
    counts = {}
    with contextlib.suppress(RuntimeError):  # a group added while this copies the registry: the next beat has it
        for group, name in list(world.pg_names.items()):
            if getattr(group, "group_desc", "") in POINT_TO_POINT:
                continue
            with contextlib.suppress(RuntimeError, AttributeError):  # a backend that keeps no count
                counts[name] = group._get_sequence_number_for_group()
    return counts
