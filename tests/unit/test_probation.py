"""Exclusions with a way back (resilience.probation): a blamed host returns once Slurm shows it repaired (a hold seen
since its blame and then service again, or a reboot since it), each hold and return a line of hosts.jsonl; Slurm's
answer is parsed strictly; a spare Slurm holds out is skipped; the gate's hosts come back the same way. The
drained-then-resumed node of a real cluster: tests/slurm/test_probation_on_slurm.py."""

from __future__ import annotations

import ast
import json
import logging
import os
import time

import pytest

from tests.conftest import REPO
from trainflow.launch.restart import gate_blames
from trainflow.launch.slurm_nodes import no_nodes, on_probation, usable_spares
from trainflow.resilience.ledger import (
    HostError,
    HostEvent,
    HostEventKind,
    JobOutcome,
    JobRun,
    Probation,
    hosts_ledger,
    jobs_ledger,
    standing,
)
from trainflow.resilience.probation import NodeState, SlurmNodesError, parse_nodes, review

BLAME = time.mktime(time.strptime("2026-12-04T12:00:00", "%Y-%m-%dT%H:%M:%S"))
DRAINED = (
    "NodeName=n3 Arch=x86_64 CoresPerSocket=2  CPUAlloc=0 CPUEfctv=2 CPUTot=2 CPULoad=2.98 AvailableFeatures=(null) "
    "NodeAddr=127.0.0.1 NodeHostName=vm Port=17003 Version=22.05.8 OS=Linux 6.18.44-fc-v1272 #1 SMP PREEMPT_DYNAMIC @0 "
    " RealMemory=4000 AllocMem=0 FreeMem=11457 Sockets=1 Boards=1 State=IDLE+DRAIN ThreadsPerCore=1 TmpDisk=0 "
    "BootTime=2026-12-04T11:14:55 SlurmdStartTime=2026-12-04T11:58:48 LastBusyTime=2026-12-04T11:58:48 CapWatts=n/a "
    "ExtSensorsTemp=n/s Reason=Xid 79 State=IDLE [root@2026-12-04T12:05:00]"
)
"""scontrol show node -o of a drained node of the local cluster (Slurm 22.05), its reason holding a false State."""


def blamed(host: str = "n3", at: float = BLAME, job_id: str = "12") -> JobRun:
    return JobRun(0, 0, job_id, at - 60, at - 50, at, JobOutcome.DIED, left_out=[host], checkpoint=int(at))


def slurm(**states: NodeState):
    """A Slurm that knows the nodes given and records what it was asked."""

    def nodes(hosts: list[str]) -> dict[str, NodeState]:
        nodes.asked.append(hosts)
        return {h: states[h] for h in hosts if h in states}

    nodes.asked = []
    return nodes


def test_scontrol_s_record_is_read_past_spaces_in_os_and_reason():
    (node,) = parse_nodes(DRAINED + "\n", ["n3"], "scontrol").values()
    assert (node.host, node.state, node.in_service) == ("n3", "IDLE+DRAIN", False)
    assert node.reason == "Xid 79 State=IDLE [root@2026-12-04T12:05:00]"
    assert node.boot == BLAME - 2705  # 45 min 5 s before
    assert parse_nodes("Node n4 not found\n", ["n4"], "scontrol") == {}  # a host Slurm does not know: no record
    assert NodeState("n1", "MIXED+COMPLETING").in_service and not NodeState("n1", "DOWN+NOT_RESPONDING").in_service


@pytest.mark.parametrize(
    "text, why",
    [
        ("slurm_load_node error: Unable to contact slurm controller", "which is no node record (NodeName is missing)"),
        (DRAINED.replace("NodeName=n3", "NodeName=n9"), "a record of 'n9' that was not asked for"),
        (f"{DRAINED}\n{DRAINED}", "a record of 'n3' that was not asked for or came twice"),
        (DRAINED.replace("OS=Linux", "OS=Linux State=IDLE"), "State reads ['IDLE', 'IDLE+DRAIN']"),
        (DRAINED.replace("BootTime=2026-12-04T11:14:55", "BootTime=5 days ago"), "BootTime reads ['5']"),
        (DRAINED.replace("Xid 79", "Xid \x1b[2J79"), "it holds control characters"),
        ("Node n9;reboot not found", "NodeName is missing"),
    ],
)
def test_hostile_or_odd_slurm_output_is_refused_in_one_line(text, why):
    with pytest.raises(SlurmNodesError, match=r"^scontrol show node -o n3 printed ") as err:
        parse_nodes(text, ["n3"], "scontrol show node -o n3")
    assert why in str(err.value) and "\n" not in str(err.value)


def test_a_host_returns_after_slurm_held_it_and_put_it_back_in_service():
    jobs, events = [blamed()], []
    # in service and never rebooted since the blame: nothing says it was repaired
    assert review(jobs, events, slurm(n3=NodeState("n3", "IDLE", boot=BLAME - 3600)), BLAME + 60) == []
    (held,) = review(jobs, events, slurm(n3=NodeState("n3", "IDLE+DRAIN", "Xid 79")), BLAME + 120)
    assert (held.kind, held.blamed_by) == ("held", "job 12")
    assert held.evidence == "Slurm holds it out: IDLE+DRAIN, reason 'Xid 79'"
    events.append(held)
    assert review(jobs, events, slurm(n3=NodeState("n3", "DOWN+DRAIN")), BLAME + 180) == []  # a hold is noted once
    assert set(standing(jobs, events).excluded) == {"n3"} and standing(jobs, events).excluded["n3"].held == held
    (back,) = review(jobs, events, slurm(n3=NodeState("n3", "IDLE", boot=BLAME - 3600)), BLAME + 86400)
    assert back.kind == "returned"
    assert back.evidence.startswith("Slurm has it IDLE after the hold seen at 2026-12-04T12:02:00: Slurm holds it out")
    events.append(back)
    assert standing(jobs, events).excluded == {} and standing(jobs, events).returned == {"n3": back}
    # blamed again after its return: out again, and the old hold does not return it
    jobs.append(blamed(at=BLAME + 90000, job_id="40"))
    assert standing(jobs, events).excluded["n3"].job == "job 40" and standing(jobs, events).returned == {}
    assert review(jobs, events, slurm(n3=NodeState("n3", "IDLE", boot=BLAME - 3600)), BLAME + 90060) == []


def test_a_reboot_after_the_blame_returns_a_host_and_one_before_it_does_not():
    jobs = [blamed("n3"), blamed("n4", job_id="13")]
    nodes = slurm(n3=NodeState("n3", "IDLE", boot=BLAME + 600), n4=NodeState("n4", "ALLOCATED", boot=BLAME - 600))
    (back,) = review(jobs, [], nodes, BLAME + 700)
    assert (back.host, back.kind) == ("n3", "returned")
    assert back.evidence == "Slurm rebooted it at 2026-12-04T12:10:00 and has it IDLE"
    assert nodes.asked == [["n3", "n4"]]  # one question for every host out
    assert review([], [], nodes, BLAME) == [] and nodes.asked == [["n3", "n4"]]  # nobody out: Slurm is not asked


def test_a_run_folder_without_a_hosts_ledger_reads_and_slurm_s_returns_are_recorded(tmp_path, caplog):
    # jobs.jsonl as the release before hosts came back wrote it (tests/assets/release-bf6c828), no hosts.jsonl
    old = {"segment": 0, "attempt": 0, "job_id": "19647", "submitted": BLAME - 60, "started": BLAME - 50}
    old |= {"ended": BLAME, "outcome": "died", "line": "", "verdict": "", "exclude": [], "left_out": ["n3"]}
    old |= {"checkpoint": 4, "step": None, "first_step_s": None}
    (tmp_path / "jobs.jsonl").write_text(json.dumps(old) + "\n")
    jobs = jobs_ledger(str(tmp_path)).read()
    assert on_probation(str(tmp_path), jobs, no_nodes) == {"n3"} and not (tmp_path / "hosts.jsonl").exists()

    def unreadable(hosts: list[str]) -> dict[str, NodeState]:
        raise SlurmNodesError("scontrol show node -o n3 did not answer (timed out)")

    with caplog.at_level(logging.INFO):
        assert on_probation(str(tmp_path), jobs, unreadable) == {"n3"}  # Slurm's answer in doubt: it stays out
        assert on_probation(str(tmp_path), jobs, slurm(n3=NodeState("n3", "DOWN"))) == {"n3"}
        assert on_probation(str(tmp_path), jobs, slurm(n3=NodeState("n3", "IDLE"))) == frozenset()
    assert "Kept every blamed host out: scontrol show node -o n3 did not answer" in caplog.text
    assert "Host n3 returned (blamed by job 19647): Slurm has it IDLE after the hold seen at" in caplog.text
    events = hosts_ledger(str(tmp_path)).read()
    assert [e.kind for e in events] == [HostEventKind.HELD, HostEventKind.RETURNED]
    assert json.loads((tmp_path / "hosts.jsonl").read_text().splitlines()[0])["format"] == 1


def test_a_spare_slurm_holds_out_is_skipped_in_one_line(caplog):
    nodes = slurm(n2=NodeState("n2", "MIXED+DRAIN", "bad gpu"), n3=NodeState("n3", "ALLOCATED"))
    assert usable_spares(["n2", "n3"], nodes) == ["n3"]
    assert caplog.messages == ["Skipped the spare n2: Slurm holds it out (MIXED+DRAIN, reason 'bad gpu')"]
    assert usable_spares(["n1", "n2"], no_nodes) == ["n1", "n2"]  # one machine: no Slurm to ask


def test_a_hostile_hosts_ledger_is_refused_in_one_line():
    event = HostEvent("n3;reboot", BLAME, HostEventKind.RETURNED, "x", "job 12")
    with pytest.raises(HostError, match="the hosts ledger names the host 'n3;reboot' to leave out"):
        standing([blamed()], [event])


def test_the_jobs_and_hosts_ledgers_are_opened_in_resilience_ledger_alone():
    """Issue 44: jobs.jsonl and hosts.jsonl are read (and appended) through resilience.ledger's jobs_ledger and
    hosts_ledger, by the launcher, the stage and trainflow.status alike: no other module names their paths or opens
    a Journal of their records."""
    src = REPO / "src/trainflow"
    found = []
    for path in sorted(src.rglob("*.py")):
        if path == src / "resilience/ledger.py":
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Attribute) and node.attr in ("jobs_log", "hosts_log"):
                found.append(f"{path.relative_to(src)}:{node.lineno} RunFolder.{node.attr}")
            if isinstance(node, ast.Call) and getattr(node.func, "id", "") == "Journal":
                kinds = {a.id for a in node.args if isinstance(a, ast.Name)} & {"JobRun", "HostEvent"}
                found += [f"{path.relative_to(src)}:{node.lineno} Journal of {k}" for k in kinds]
    assert not found, f"open the ledgers with resilience.ledger.jobs_ledger / hosts_ledger: {found}"


def test_the_gates_hosts_return_as_a_failures_do(tmp_path):
    """nccl-exclude.txt's hosts are blamed when the gate wrote it and come back on Slurm's evidence since then (they
    were left out for the campaign's life before); a job's later blame of one of them is its newest."""
    path = tmp_path / "nccl-exclude.txt"
    path.write_text("n3,n4\n")
    os.utime(path, (BLAME, BLAME))
    gate = gate_blames(path)
    assert gate == {"n3": Probation("the gate", BLAME), "n4": Probation("the gate", BLAME)}
    nodes = slurm(n3=NodeState("n3", "IDLE", boot=BLAME + 600), n4=NodeState("n4", "IDLE", boot=BLAME - 600))
    assert on_probation(str(tmp_path), [], nodes, gate) == {"n4"}  # n3 rebooted since the gate blamed it
    (back,) = hosts_ledger(str(tmp_path)).read()
    assert (back.host, back.kind, back.blamed_by) == ("n3", "returned", "the gate")
    assert set(standing([], [back], gate).excluded) == {"n4"} and standing([], [back], gate).returned == {"n3": back}
    later = standing([blamed("n3", at=back.at + 60)], [back], gate)
    assert later.excluded["n3"].job == "job 12" and later.returned == {}
    assert gate_blames(tmp_path / "absent.txt") == {}


class Checks:
    """resilience.probation.HealthChecks whose jobs end as told (the real ones: tests/slurm/test_probation_on_slurm)."""

    after_s = 3600.0

    def __init__(self, *outcomes: tuple[bool, str] | None) -> None:
        self.outcomes, self.submitted = list(outcomes), []

    def submit(self, host: str) -> str:
        self.submitted.append(host)
        return str(100 + len(self.submitted))

    def outcome(self, host: str, job_id: str) -> tuple[bool, str] | None:
        return self.outcomes.pop(0)


def test_a_host_slurm_keeps_in_service_returns_when_its_health_check_passes_and_is_checked_again_when_it_fails():
    jobs, events, idle = [blamed()], [], slurm(n3=NodeState("n3", "IDLE"))
    checks = Checks(None, (False, "failed: NVML: GPU 0: uncorrected ECC errors"), None, (True, "passed: 4 rank(s)"))

    def at(hours: float) -> list[HostEvent]:
        new = review(jobs, events, idle, BLAME + hours * 3600, checks=checks)
        events.extend(new)
        return new

    assert at(0.5) == [] and checks.submitted == []  # not due: resilience.health_check_after_s after its blame
    (submitted,) = at(1.0)
    assert (submitted.kind, submitted.check_job, checks.submitted) == (HostEventKind.CHECKING, "101", ["n3"])
    assert at(1.2) == []  # still running: nothing new, nothing submitted again
    (failed,) = at(1.5)
    assert failed.kind == HostEventKind.CHECK_FAILED and failed.evidence.endswith("uncorrected ECC errors")
    assert standing(jobs, events).excluded.keys() == {"n3"}
    assert at(2.0) == [] and len(checks.submitted) == 1  # due again an hour after the failed check
    (again,) = at(2.5)
    assert again.kind == HostEventKind.CHECKING and again.check_job == "102"
    assert at(2.6) == []
    (back,) = at(3.0)
    assert back.kind == HostEventKind.RETURNED and back.evidence == "its health check (job 102) passed: 4 rank(s)"
    assert standing(jobs, events).excluded == {} and standing(jobs, events).returned.keys() == {"n3"}


def test_a_held_host_is_not_health_checked_and_an_altered_check_job_fails_its_check():
    checks = Checks()
    drained = slurm(n3=NodeState("n3", "IDLE+DRAIN", "Xid 79"))
    (held,) = review([blamed()], [], drained, BLAME + 7200, checks=checks)
    assert held.kind == HostEventKind.HELD and checks.submitted == []
    altered = HostEvent("n3", BLAME + 10, HostEventKind.CHECKING, "x", "job 12", check_job="1;scancel -u root")
    (failed,) = review([blamed()], [altered], slurm(n3=NodeState("n3", "IDLE")), BLAME + 20, checks=checks)
    assert failed.kind == HostEventKind.CHECK_FAILED and "names no check job ('1;scancel -u root')" in failed.evidence
