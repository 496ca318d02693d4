"""Whether a failed job is restarted (resilience.verdict): each class of failure a restart cannot fix ends the stage in
one line; a dead or hung rank's host is left out; host names from run-folder files are checked before they reach
sbatch."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from submitit.core.utils import JobPaths

from trainflow.launch.hang import read_report, write_report
from trainflow.launch.heartbeat import timing_path
from trainflow.launch.restart import gate_exclusions, straggler_hosts
from trainflow.resilience.hang import HangReport
from trainflow.resilience.ledger import HostError, JobOutcome
from trainflow.resilience.timing import RankTiming, stragglers
from trainflow.resilience.verdict import JobFailure, judge

SUBMITIT_NOT_REQUEUED = "Job not requeued because: timed-out too many times."


def failure(kind: str = "died", *, errors: dict | None = None, **facts) -> JobFailure:
    host = facts.pop("host", "nid001")
    return JobFailure(line="line", kind=JobOutcome(kind), host=host, errors=errors or {}, world=4, **facts)


def test_a_dead_or_hung_rank_is_restarted_without_its_host():
    for kind in ("died", "hang"):
        verdict = judge(failure(kind), [], max_restarts=3, restarts=0, slow=frozenset({"nid007"}))
        assert verdict.restart and verdict.exclude == {"nid001", "nid007"}
        assert verdict.why == "restart 1 of 3, leaving out nid001, nid007"


@pytest.mark.parametrize(
    ("case", "earlier", "why"),
    [
        (failure("raised", errors={1: "ConfigError: x"}, expected=True), [], "trainflow refused an input"),
        (
            failure("raised", errors={k: "ZeroDivisionError: x" for k in range(4)}),
            [failure("raised", errors={k: "ZeroDivisionError: x" for k in range(4)})],
            "every rank raised 'ZeroDivisionError: x' at once again",
        ),
        (
            failure("raised", errors={2: "KeyError: 'w'"}),
            [failure("raised", errors={0: "KeyError: 'w'"})],
            "the same exception in two jobs",
        ),
        (
            failure("raised", errors={1: "torch.OutOfMemoryError: CUDA out of memory"}, step=7),
            [failure("raised", errors={3: "torch.OutOfMemoryError: CUDA out of memory."}, step=7)],
            "out of memory at step 7 twice",
        ),
        (failure("stopped", state="CANCELLED"), [], "Slurm ended the job (CANCELLED)"),
        (
            failure("raised", errors={0: f"UncompletedJobError: {SUBMITIT_NOT_REQUEUED}"}, state="FAILED"),
            [],
            "more often than cluster.allocation.max_requeues allows",
        ),
        (failure("died"), [failure("died")] * 3, "max_restarts(3) used up"),
    ],
)
def test_what_a_restart_cannot_fix_is_not_restarted(case, earlier, why):
    verdict = judge(case, earlier, max_restarts=3, restarts=len(earlier))
    assert not verdict.restart and why in verdict.why and verdict.why.startswith("not restarted: ")


def test_out_of_memory_at_another_step_is_restarted():
    earlier = [failure("raised", errors={1: "torch.OutOfMemoryError: CUDA out of memory"}, step=3)]
    case = failure("raised", errors={1: "torch.OutOfMemoryError: CUDA out of memory (again)"}, step=9)
    assert judge(case, earlier, max_restarts=3, restarts=1).restart


@pytest.mark.parametrize("host", ["nid001\n#SBATCH --wrap=id", "$(id)", "-x", "a b", ""])
def test_a_hostile_host_name_never_reaches_sbatch(host):
    with pytest.raises(HostError, match="is not a node name"):
        judge(failure("died", host=host or "-"), [], max_restarts=3, restarts=0)


def test_the_gate_s_exclude_file_is_read_and_checked(tmp_path):
    path = tmp_path / "nccl-exclude.txt"
    assert gate_exclusions(path) == frozenset()
    path.write_text("nid001,nid002\n")
    assert gate_exclusions(path) == {"nid001", "nid002"}
    path.write_text("nid001;touch /tmp/pwned\n")
    with pytest.raises(HostError, match=r"nccl-exclude.txt names the host 'nid001;touch /tmp/pwned'"):
        gate_exclusions(path)


def test_stragglers_are_the_ranks_well_above_the_median(tmp_path):
    timings = [RankTiming(r, f"nid00{r // 2}", 1.0 + 0.01 * r, 20) for r in range(8)]
    timings[5] = RankTiming(5, "nid002", 1.8, 20)
    assert [t.rank for t in stragglers(timings, 1.5)] == [5]
    paths = JobPaths(tmp_path, job_id="42")
    assert straggler_hosts(paths, 1.5) == frozenset()  # no timing file: none
    timing_path(paths).write_text(json.dumps([t.to_json() for t in timings]))
    assert straggler_hosts(paths, 1.5) == {"nid002"}
    timing_path(paths).write_text(
        json.dumps([{**timings[5].to_json(), "host": "x;id"}] + [t.to_json() for t in timings])
    )
    with pytest.raises(HostError):
        straggler_hosts(paths, 1.5)
    Path(timing_path(paths)).write_text("{not json")
    assert straggler_hosts(paths, 1.5) == frozenset()


def test_the_first_hang_verdict_is_kept(tmp_path):
    paths = JobPaths(tmp_path, job_id="7")
    first = HangReport(1, "n2", 3, "compute", 6.0, False, 5.0, 0, "torch.distributed.all_reduce (x.py:1, f)")
    later = HangReport(0, "?", -1, "start", 6.0, False, 5.0, 1, "nothing")  # a resumed stopped rank's view
    assert write_report(paths, first) and not write_report(paths, later)
    assert read_report(paths) == first
    assert sorted(p.name for p in tmp_path.iterdir()) == ["7_hang.json"]
