"""Asynchronous checkpoint saves (checkpoint.mode=async): staged to host memory, written by a background process,
committed by the coordinator at a step boundary, with the integrity contract of a synchronous save.

    python -m pytest tests/unit/test_checkpoint_async.py   # a 1-rank save, a full disk, a killed writer

A save is staged (checkpoint.staging) and handed to this rank's writer process, which writes the rank's DCP
shards through ChecksummingWriter (CRC-32C while writing, fsync). At each later step boundary every rank says
where its part stands (one all_reduce); once every rank's write has succeeded, rank 0 writes `.metadata`
(checksummed as it is written) and manifest.json, fsyncs, renames step-N.tmp to step-N and fsyncs the folder, in
a background thread, exactly as the synchronous save's commit (CheckpointManager.commit); the boundary after that
reports the checkpoint durable. A failure anywhere (the full disk, an I/O error, a writer process that died)
is the same one-line CheckpointWriteError on every rank at the next boundary, and no step-N/ appears.

Why not torch.distributed.checkpoint.async_save(async_checkpointer_type=PROCESS), tried with torch 2.13 (it
takes ChecksummingWriter, pickled into its process, and writes DCP's files through it):
- its background process answers with DCP's Metadata only: ChecksummingWriter's CRCs stay in that process (the
  caller's writer came back with none), so the manifest would need a second read of every shard;
- it commits in the background: its coordinator process writes `.metadata`, and a trainer SIGKILLed during the
  write leaves its writer (a daemon only at a clean exit) finishing the checkpoint, `.metadata` and all, after
  the rank died; here only a live rank 0, after every live rank agreed, publishes anything;
- one module-level writer process serves every save, and once it died every later save fails;
- it sends the staged state through its pipe at every save (each tensor's shared memory handed over again).
What runs instead is DCP's own: DefaultSavePlanner plans (once: the plan is cached while the state's layout
holds), FileSystemWriter.write_data writes in the writer process, FileSystemWriter.finish writes `.metadata`, so
the folder is DCP's format file for file, loaded by the same reader. The writer process is spawned (not forked:
CUDA and gloo threads), maps the staging buffers once, and dies with its rank (PR_SET_PDEATHSIG): a rank killed
mid-write leaves a step-N.tmp/ no one publishes, the previous checkpoint the newest valid one.
"""

from __future__ import annotations

import ctypes
import logging
import os
import signal
import time
from dataclasses import dataclass
from multiprocessing.connection import Connection
from pathlib import Path

import torch
import torch.multiprocessing as mp  # noqa: F401 (registers torch's tensor reductions: buffers go as shared memory)
from torch.distributed.checkpoint.planner import SavePlan, WriteItem
from torch.utils.serialization import config as serialization_config

from trainflow.checkpoint.writer import ChecksummingWriter, WriteFailure, describe_failure

log = logging.getLogger(__name__)

PR_SET_PDEATHSIG = 1
NICE = 10
"""The writer's scheduling niceness: where cores are short, the training rank's threads go first (the write has an
interval's slack; a step has none)."""
IGNORED_SIGNALS = (signal.SIGUSR2, signal.SIGTERM)
"""What the writer process leaves to its rank (serve)."""


@dataclass(frozen=True)
class Written:
    """A writer process's answer: the write results DCP's finish needs, the files' (bytes, CRC-32C), and the first
    failure, or None."""

    results: list
    checksums: dict[str, tuple[int, int]]
    failure: WriteFailure | None
    seconds: float


class StagedPlanner:
    """What FileSystemWriter.write_data asks of a planner, in the writer process: each item's tensor, from the
    staging buffers (every item is one rank's whole tensor or its whole local shard)."""

    def __init__(self, buffers: dict[str, torch.Tensor]) -> None:
        self.buffers = buffers

    def resolve_data(self, item: WriteItem) -> torch.Tensor:
        return self.buffers[item.index.fqn]


def serve(conn: Connection, parent: int) -> None:
    """The writer process: ("setup", buffers, plan) once per layout, then ("write", folder, io_threads) per save,
    each answered with a Written; ends when its rank does."""
    ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
    if os.getppid() != parent:  # the rank died before the line above
        return
    # Slurm signals every process of a job step: its pre-timeout USR2 and the TERM of a time limit or scancel reach
    # this process too, whose default is to die mid-write. They are the rank's to handle (save, then requeue or stop),
    # and the rank waits for this write first; the rank's end still ends this process (PR_SET_PDEATHSIG).
    for stop in IGNORED_SIGNALS:
        signal.signal(stop, signal.SIG_IGN)
    os.environ["CUDA_VISIBLE_DEVICES"] = ""  # it writes host memory; a CUDA context would cost device memory
    os.nice(NICE)
    buffers: dict[str, torch.Tensor] = {}
    plan: SavePlan | None = None
    while True:
        try:
            message = conn.recv()
        except EOFError:
            return
        if message[0] == "setup":
            _, buffers, plan = message
        elif message[0] == "write":
            conn.send(write(Path(message[1]), plan, StagedPlanner(buffers), io_threads=message[2]))
        else:
            return


def write(folder: Path, plan: SavePlan | None, planner: StagedPlanner, *, io_threads: int) -> Written:
    """Write this rank's shards of `plan` into `folder`, as a synchronous save does (CheckpointManager.save)."""
    start = time.perf_counter()
    writer = ChecksummingWriter(folder, thread_count=io_threads)
    results, failure = [], None
    try:
        with serialization_config.patch("save.compute_crc32", False):  # the manifest's CRC-32C covers these bytes
            results = writer.write_data(plan, planner).value()
    except Exception as err:  # the writer's own record of it (below) names the file
        failure = describe_failure(None, err)
    if writer.failure is not None:  # DCP drops a writer thread's exception other than its calling one's
        failure = writer.failure
    return Written(results, dict(writer.checksums), failure, time.perf_counter() - start)


class WriterDied(Exception):
    """The writer process ended without answering."""


class WriterProcess:
    """This rank's writer process and its pipe."""

    def __init__(self) -> None:
        ctx = mp.get_context("spawn")
        self.conn, child = ctx.Pipe()
        self.process = ctx.Process(target=serve, args=(child, os.getpid()), daemon=True, name="trainflow-writer")
        self.process.start()  # from the saving (main) thread, which lives as long as the rank: PDEATHSIG's parent
        child.close()

    def setup(self, buffers: dict[str, torch.Tensor], plan: SavePlan) -> None:
        self.conn.send(("setup", buffers, plan))

    def write(self, folder: Path, io_threads: int) -> None:
        self.conn.send(("write", str(folder), io_threads))

    def answer(self, *, block: bool) -> Written | None:
        """The answer to the last write (None: not yet, unless `block`); WriterDied if the process ended instead."""
        while not self.conn.poll(0.5 if block else 0):
            if not self.process.is_alive():
                break  # its end of the pipe is closed: recv below raises EOFError
            if not block:
                return None
        try:
            return self.conn.recv()
        except (EOFError, OSError):
            self.process.join(timeout=5)
            raise WriterDied(self.exit_text()) from None

    def exit_text(self) -> str:
        code = self.process.exitcode
        if code is not None and code < 0:
            return f"its writer process (pid {self.process.pid}) was killed by {signal.Signals(-code).name}"
        return f"its writer process (pid {self.process.pid}) exited with code {code}"

    def kill(self) -> None:
        if self.process.is_alive():
            self.process.kill()
        self.process.join(timeout=5)

    def close(self) -> None:
        try:
            self.conn.send(("stop",))
        except (BrokenPipeError, OSError):
            pass
        self.process.join(timeout=10)
        self.kill()
