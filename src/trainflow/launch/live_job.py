"""The job training a segment now, and the stage process waiting for it (live-<segment>.json beside the checkpoints):
what a rerun needs to re-attach instead of submitting a second job that would train the same series beside the first.

    python -c "from trainflow.records import read_record; from trainflow.launch.live_job import LiveJob; \
        print(read_record(LiveJob, 'runs/default/capacity/checkpoints/<series>/live-0.json'))"

A login node reboots or an ssh session drops and the Snakemake process dies while a segment's job trains on (on Slurm,
or as local processes). The stage writes the record once it has submitted, and clears it once the job's end is in the
jobs ledger. A rerun's stage that finds the record takes the job over (LiveJobs.attach): it names itself the waiter
and waits for that job as for one it submitted; a job that has ended meanwhile is judged as any that ended (its
results, or its failure from its logs). A waiter that finds itself replaced when its job ends leaves it to the new
one (Superseded) and records nothing. The record is a run-folder file, so hostile: its job id is checked (digits), its
folder must be the stage's own, and a local job is reached only through a process whose start time and command line
are the ones recorded, so no other process is ever signalled.
"""

from __future__ import annotations

import logging
import os
import re
import time
from dataclasses import dataclass, replace
from pathlib import Path

import submitit
from submitit.local.local import LocalJob

from trainflow.atomic import write_json
from trainflow.config import TrainflowConfig
from trainflow.config.run_folder import RunFolder
from trainflow.errors import TrainflowError
from trainflow.host import hostname
from trainflow.records import Record, read_record

log = logging.getLogger(__name__)

JOB_ID = re.compile(r"[0-9]{1,12}")


class Superseded(TrainflowError):
    """This stage's job is waited for by another (a rerun that re-attached): it records nothing."""


@dataclass(frozen=True)
class Process(Record):
    """A process on a host, told apart from a later one with its pid by its start time (/proc/<pid>/stat)."""

    host: str
    pid: int
    started: int
    """Its start, in clock ticks since boot."""

    @classmethod
    def of(cls, pid: int) -> Process | None:
        started = start_ticks(pid)
        return None if started is None else cls(hostname(), pid, started)

    def alive(self) -> bool:
        return self.host == hostname() and start_ticks(self.pid) == self.started

    def line(self) -> str:
        return f"process {self.pid} on {self.host}"


@dataclass(frozen=True)
class LiveJob(Record):
    segment: int
    attempt: int
    job_id: str
    kind: str
    """local or slurm."""
    tasks: int
    submitted: float
    exclude: list[str]
    waiter: Process
    """The stage process waiting for the job."""
    controller: Process | None = None
    """A local job's controller process (its job id is the controller's pid)."""


def start_ticks(pid: int) -> int | None:
    """When process `pid` started (field 22 of /proc/<pid>/stat); None where there is no such process."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return int(stat.rsplit(")", 1)[1].split()[19])  # the fields after the command's closing parenthesis


class Attached:
    """A process this one did not start, polled and signalled as subprocess.Popen is (submitit's LocalJob reads
    poll() and send_signal()): a re-attached local job's controller, only while it is the process recorded."""

    def __init__(self, process: Process, command: str) -> None:
        self.process, self.command = process, command

    def running(self) -> bool:
        try:
            cmdline = Path(f"/proc/{self.process.pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()
        except OSError:
            return False
        return self.process.alive() and self.command in cmdline

    def poll(self) -> int | None:
        return None if self.running() else 0  # its exit status is its parent's to read: the job's logs say how

    def send_signal(self, signum: int) -> None:
        if self.running():
            os.kill(self.process.pid, signum)


class LiveJobs:
    """The live record of one segment of the config's series."""

    def __init__(self, cfg: TrainflowConfig) -> None:
        self.cfg, self.path = cfg, Path(RunFolder.live_job(cfg.io.checkpoints, cfg.segment))
        self.me = Process.of(os.getpid())

    def submitted(self, job: submitit.Job, *, attempt: int, submitted: float, exclude: frozenset[str]) -> None:
        local = isinstance(job, LocalJob)
        record = LiveJob(
            segment=self.cfg.segment,
            attempt=attempt,
            job_id=str(job.job_id),
            kind="local" if local else "slurm",
            tasks=job.num_tasks,
            submitted=submitted,
            exclude=sorted(exclude),
            waiter=self.me,
            controller=Process.of(int(job.job_id)) if local else None,
        )
        write_json(self.path, record.to_json())

    def attach(self) -> tuple[submitit.Job, LiveJob] | None:
        """The job a stage before this one submitted and left (None: none), now this process's to wait for."""
        if not self.path.exists():
            return None
        record = read_record(LiveJob, self.path, rerun=f"nothing: delete {self.path} if no job of segment is running")
        if record.segment != self.cfg.segment or not JOB_ID.fullmatch(record.job_id) or record.kind not in KINDS:
            raise TrainflowError(
                f"{self.path} names job {record.job_id!r} ({record.kind}) of segment {record.segment}, which no stage "
                f"of segment {self.cfg.segment} writes; the file was altered: delete it and rerun"
            )
        job = KINDS[record.kind](self.cfg, record)
        was = record.waiter
        write_json(self.path, replace(record, waiter=self.me).to_json())
        how = "still waiting, left to this one" if was.alive() else "gone"
        log.warning(
            "Re-attached to %s job %s of segment %d (attempt %d, submitted %s) instead of submitting another: its "
            "waiter, %s, is %s",
            *(record.kind, record.job_id, record.segment, record.attempt, time.ctime(record.submitted)),
            *(was.line(), how),
        )
        return job, record

    def mine(self) -> bool:
        """Whether this process still waits for the segment's job: the record names it. A rerun may have re-attached
        (it names that one) and, once the job's end was in the ledger, cleared the record."""
        if not self.path.exists():
            return False
        return read_record(LiveJob, self.path, rerun="nothing").waiter == self.me

    def check_mine(self, job: submitit.Job) -> None:
        """Raise Superseded where a rerun took the job over from this process."""
        if not self.mine():
            raise Superseded(
                f"segment {self.cfg.segment}'s job {job.job_id} is waited for by another stage (a rerun re-attached, "
                f"{self.path}): this one records nothing"
            )

    def clear(self) -> None:
        """The job's end is on record (the jobs ledger): no rerun re-attaches to it."""
        if self.mine():
            self.path.unlink()


def local_job(cfg: TrainflowConfig, record: LiveJob) -> submitit.Job:
    """A local job re-attached: its controller (`python -m trainflow.launch <folder>`) reached only while it is the
    process recorded."""
    folder = Path(cfg.io.submitit).expanduser().absolute()  # as the executor named it on the controller's line
    process = Attached(record.controller, f"trainflow.launch {folder}") if record.controller else None
    return LocalJob(folder=folder, job_id=record.job_id, process=process, tasks=list(range(record.tasks)))


def slurm_job(cfg: TrainflowConfig, record: LiveJob) -> submitit.Job:
    return submitit.SlurmJob(cfg.io.submitit, record.job_id, tasks=tuple(range(record.tasks)))


KINDS = {"local": local_job, "slurm": slurm_job}
