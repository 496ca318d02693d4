"""The hot restart's decisions (launch.supervisor), without processes: which failures a new job step on a spare
follows, which go back to the stage (a new job, or its end), and the hosts of the next step."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest
import submitit
from submitit.helpers import DelayedSubmission
from submitit.slurm.slurm import SlurmExecutor

from tests.conftest import make_config
from trainflow.config import compose
from trainflow.config.run_folder import RunFolder
from trainflow.journal import Journal
from trainflow.launch import build_executor
from trainflow.launch import steps as launch_steps
from trainflow.launch import supervisor as supervisor_module
from trainflow.launch.gate_job import found_by
from trainflow.launch.job_end import LaunchError
from trainflow.launch.steps import LocalSteps, SrunSteps, answering
from trainflow.launch.supervisor import Supervisor, allocated, probed, swapped
from trainflow.launch.task import MASTER_ADDR
from trainflow.resilience.arrivals import Arrival, ArrivalKind, drilled_hosts
from trainflow.resilience.ledger import NO_FAILURE, JobOutcome, JobRun, standing
from trainflow.resilience.verdict import JobFailure
from trainflow.stages.train_segment import drill

NCCL = "torch.distributed.DistBackendError: NCCL error in: ProcessGroupNCCL.cpp:3356, remote process exited"


@pytest.fixture(scope="module")
def supervisor() -> Supervisor:
    cfg = compose("train_segment", ["experiment=smoke", "cluster.allocation.spare_nodes=1"])
    return Supervisor(cfg, task=None, attempt=0, submitted=0.0, exclude=frozenset(), earlier=[])


@pytest.fixture
def job(tmp_path) -> submitit.Job:
    """The failed step: its folder holds no task marker, no node report, no timing file."""
    return submitit.local.local.LocalJob(tmp_path, "7", tasks=(0, 1))


def unchecked() -> tuple[list[str], str]:
    raise AssertionError("only a hang no rank's evidence pins, or an NCCL error no node confirms, is checked")


def died(host: str = "n2") -> JobFailure:
    return JobFailure(line=f"rank 1 on host {host} was killed by SIGKILL", kind=JobOutcome.DIED, rank=1, host=host)


def test_a_dead_rank_s_host_is_swapped_for_a_spare_and_a_used_up_spare_goes_back_to_the_stage(supervisor, job):
    verdict, why = supervisor.verdict(died(), job, [], [], (["n1", "n2"], ["n3"]), unchecked)
    assert verdict.restart and verdict.exclude == {"n2"} and why == ""
    assert swapped(["n1", "n2"], ["n3"], {"n2"}) == (["n1", "n3"], [])
    assert swapped(["n1", "n2"], ["n3", "n4"], {"n1"}) == (["n3", "n2"], ["n4"])
    verdict, why = supervisor.verdict(died("n3"), job, [], [], (["n1", "n3"], []), unchecked)
    assert verdict.restart and why == "the job's 1 spare node(s) are used up: a new job"


def test_an_nccl_error_no_node_confirms_is_checked_inside_the_job_and_restarted_on_the_same_hosts(supervisor, job):
    raised = JobFailure(line="x", kind=JobOutcome.RAISED, rank=0, host="n1", errors={0: NCCL, 1: NCCL}, world=2)
    checks = []
    verdict, why = supervisor.verdict(raised, job, [], [], (["n1", "n2"], []), lambda: checks.append(1) or ([], "ok"))
    assert verdict.restart and verdict.exclude == frozenset() and why == "" and checks == [1]


def test_a_symmetric_hang_is_checked_inside_the_job_and_restarted_there(supervisor, job):
    """The gate's checks as a step on the job's own hosts: a slow host found is swapped for the spare; none found, or
    checks that could not run, restart on the same hosts blaming nobody."""
    symmetric = JobFailure(line="every rank made no progress", kind=JobOutcome.HANG)
    hosts = (["n1", "n2"], ["n3"])
    for found, said in [([], "found no slow host"), ([], "could not run (x): no host blamed")]:
        verdict, why = supervisor.verdict(symmetric, job, [], [], hosts, lambda f=found, s=said: (f, s))
        assert verdict.restart and verdict.exclude == frozenset() and why == "" and verdict.why.endswith(f"({said})")
    verdict, why = supervisor.verdict(symmetric, job, [], [], hosts, lambda: (["n2"], "found n2 slow"))
    assert verdict.restart and verdict.exclude == {"n2"} and why == "", verdict


def test_a_check_that_cannot_run_blames_nobody(supervisor):
    def lost() -> list:
        raise LaunchError("srun: error: Unable to create step for job 12: Job/step already completing")

    assert found_by(supervisor.cfg, lost, "inside the job") == (
        [],
        "the gate's checks inside the job could not run (srun: error: Unable to create step for job 12: Job/step "
        "already completing): no host blamed",
    )


def test_what_the_stage_must_judge_goes_back_to_it(supervisor, job):
    refused = JobFailure(line="x", kind=JobOutcome.RAISED, rank=0, host="n1", errors={0: "E: x"}, expected=True)
    verdict, why = supervisor.verdict(refused, job, [], [], (["n1", "n2"], ["n3"]), unchecked)
    assert not verdict.restart and why == verdict.why and why.startswith("not restarted")


SLURM = ["cluster=slurm_local", "cluster.allocation.nodes=2", "cluster.allocation.spare_nodes=1", "parallel=dp2"]


def test_a_supervised_job_holds_the_spares_and_starts_one_task(tmp_path, monkeypatch):
    monkeypatch.setattr(SlurmExecutor, "affinity", classmethod(lambda cls: 2))  # no srun needed for the script
    allocation = compose("train_segment", SLURM).cluster.allocation
    slurm = build_executor(allocation, world_size=2, folder=tmp_path, name="hot", supervised=True)._executor
    text = slurm._make_submission_file_text(slurm._submitit_command_str, "uid")
    assert "#SBATCH --nodes=3\n" in text and "#SBATCH --no-kill\n" in text, text
    assert " --nodes=1 --ntasks=1 " in text and "--kill-on-bad-exit" not in text, text


def test_a_step_runs_on_its_hosts_inside_the_allocation(tmp_path, monkeypatch):
    started = {}

    def popen(command, **kwargs):
        started.update(command=command, env=kwargs["env"])

    monkeypatch.setattr(launch_steps.subprocess, "Popen", popen)
    monkeypatch.setenv("SLURM_JOB_ID", "12")
    monkeypatch.setenv("SLURM_RESTART_COUNT", "1")  # requeued once: the ranks may requeue it max_requeues - 1 times
    steps = SrunSteps(compose("train_segment", SLURM).cluster.allocation, 2)
    job = steps.launch(print, ["n1", "n3"], tmp_path / "12.1")
    command = started["command"]
    shape = ("--nodelist=n1,n3", "--nodes=2", "--ntasks=2", "--ntasks-per-node=1")
    assert set(shape) | {"--overlap", "--kill-on-bad-exit=1"} <= set(command), command
    assert command[-1] == str(tmp_path / "12.1") and started["env"][MASTER_ADDR] == "n1"
    delayed = DelayedSubmission.load(job.paths.submitted_pickle)
    assert job.num_tasks == 2 and delayed._timeout_countdown == 3 - 1 and delayed._timeout_min == 10


def test_a_requeued_job_s_first_step_leaves_out_what_its_earlier_steps_did():
    assert allocated(["n1", "n2", "n3"], 2, set()) == (["n1", "n2"], ["n3"])
    assert allocated(["n1", "n2", "n3"], 2, {"n2"}) == (["n1", "n3"], [])
    with pytest.raises(LaunchError, match="hold 1 not left out, fewer than 2"):
        allocated(["n1", "n2", "n3"], 2, {"n2", "n3"})


@pytest.mark.parametrize(("restarts", "requeued"), [(2, False), (1, True)])
def test_the_time_limit_s_step_is_requeued_by_rank_0_or_else_by_the_supervisor(monkeypatch, restarts, requeued):
    """SLURM_RESTART_COUNT=1: Slurm showing Restarts=2 means rank 0 requeued the job; Restarts=1, nobody did."""
    calls = []

    def run(command, **kwargs):
        calls.append(command)
        return subprocess.CompletedProcess(command, 0, stdout=f"JobId=12 Requeue=1 Restarts={restarts} BatchFlag=1")

    monkeypatch.setattr(launch_steps.subprocess, "run", run)
    monkeypatch.setenv("SLURM_JOB_ID", "12")
    monkeypatch.setenv("SLURM_RESTART_COUNT", "1")
    steps = SrunSteps(compose("train_segment", SLURM).cluster.allocation, 2)
    how = steps.requeue()
    assert (["scontrol", "requeue", "12"] in calls) is requeued, calls
    assert how == ("the supervisor requeued the job (its ranks had not)" if requeued else "its rank 0 requeued the job")
    monkeypatch.setenv("SLURM_RESTART_COUNT", "3")  # max_requeues=3 used up
    with pytest.raises(LaunchError, match=r"its 3 requeue\(s\) used up \(cluster.allocation.max_requeues=3\)"):
        steps.requeue()


def test_a_requeued_step_is_no_failure():
    assert JobOutcome.REQUEUED in NO_FAILURE and "completed" in NO_FAILURE and JobOutcome.LOST not in NO_FAILURE
    run = JobRun(segment=0, attempt=0, job_id="12.0", submitted=0, started=1, ended=2, outcome=JobOutcome.REQUEUED)
    assert standing([run]).without_progress == 0


def test_a_host_blamed_only_for_injected_failures_is_not_left_out_of_later_jobs(tmp_path):
    """The spares' drill leaves a host out of its job; a real failure's host stays out of the run's later jobs."""
    ledger = tmp_path / "faults.jsonl"
    Journal(ledger, Arrival).append(Arrival(10.0, ArrivalKind.START))
    Journal(ledger, Arrival).append(Arrival(15.0, ArrivalKind.KILL, rank=1, host="n2"))
    Journal(ledger, Arrival).append(Arrival(35.0, ArrivalKind.STALL, rank=0, host="n1"))

    def job(k: int, left_out: list[str], at: float) -> JobRun:
        return JobRun(0, k, f"7.{k}", at, at, at + 10, JobOutcome.DIED, left_out=left_out)

    jobs = [job(0, ["n2"], 10.0), job(1, ["n3"], 20.0), job(2, ["n1"], 30.0)]
    assert drilled_hosts(ledger, jobs) == {"n1", "n2"}  # n3's failure was no drill's
    assert drilled_hosts(ledger, [*jobs, job(3, ["n1"], 50.0)]) == {"n2"}  # n1 failed again, undrilled
    assert drilled_hosts(tmp_path / "none.jsonl", jobs) == frozenset()


def test_a_faults_file_written_into_a_run_without_a_drill_excuses_no_host(tmp_path):
    """Only a drill (fault.mtbf_s) reads faults.jsonl: a line written there cannot bring back a host a real failure
    blamed (train_segment.drill)."""
    plain = make_config("train_segment", tmp_path)
    ledger = Path(RunFolder.faults_log(plain.io.checkpoints))
    ledger.parent.mkdir(parents=True, exist_ok=True)
    Journal(ledger, Arrival).append(Arrival(10.0, ArrivalKind.START))
    Journal(ledger, Arrival).append(Arrival(15.0, ArrivalKind.KILL, rank=1, host="n2"))
    job = JobRun(0, 0, "7.0", 10.0, 10.0, 20.0, JobOutcome.DIED, left_out=["n2"])
    assert drill(plain) == {}
    assert drill(make_config("train_segment", tmp_path, "fault.mtbf_s=30"))["excused"]([job]) == {"n2"}


def test_a_step_lost_with_no_node_named_is_checked_and_a_host_that_cannot_start_a_task_is_swapped(supervisor, job):
    lost = JobFailure(line="job 7.2 ended without the results of ranks 0-1", kind=JobOutcome.LOST)
    hosts = (["n1", "n2"], ["n3"])
    verdict, why = supervisor.verdict(lost, job, [], [], hosts, lambda: (["n2"], "n2 cannot start a task (x)"))
    assert (
        verdict.restart
        and verdict.exclude == {"n2"}
        and why == ""
        and verdict.why.endswith("(n2 cannot start a task (x))")
    )


class Unanswered(LocalSteps):
    """One machine's steps whose hosts `dead` do not start a task."""

    def __init__(self, dead: dict[str, str]) -> None:
        super().__init__(None, 2)
        self.dead = dead

    def unanswered(self, hosts: list[str]) -> dict[str, str]:
        return {h: why for h, why in self.dead.items() if h in hosts}


def test_a_host_that_cannot_start_a_task_is_found_before_the_gates_checks(supervisor, tmp_path, monkeypatch):
    said = "Task launch for StepId=7.3 failed on node n2: Communication connection failure"
    steps = Unanswered({"n2": said})
    assert probed(supervisor.cfg, steps, ["n1", "n2"], tmp_path) == (["n2"], f"n2 cannot start a task ({said})")
    assert answering(steps, ["n2", "n3"]) == ["n3"]
    monkeypatch.setattr(supervisor_module, "checked", lambda cfg, steps, hosts, folder: ([], "the gate's: none slow"))
    assert probed(supervisor.cfg, Unanswered({}), ["n1", "n2"], tmp_path) == ([], "the gate's: none slow")
