"""trainflow.status on run folders written here (a real training run's: tests/distributed/test_observe.py): a segment
in flight whose steps.jsonl ends in half a line, a job that failed and was restarted, and hostile folders, each of
which ends in one line; none of it imports torch."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import pytest

from trainflow.config.run_folder import RunFolder
from trainflow.evaluate.records import EvalRecord, TaskScore
from trainflow.evaluate.tasks import TaskKind
from trainflow.resilience.goodput import Span
from trainflow.resilience.ledger import HostEvent, HostEventKind, JobRun
from trainflow.resilience.probation import clock
from trainflow.status.__main__ import NOT_STARTED, main
from trainflow.status.read import State, read_status
from trainflow.status.show import render
from trainflow.train.run_record import RunRecord
from trainflow.train.step_log import StepRecord

HASH = "0123456789ab"
T0 = 1_700_000_000.0
RECORD = RunRecord("default", HASH, 2, 4, 8, 2048, 2, f"capacity/checkpoints/{HASH}", 1, T0)


def step(n: int) -> StepRecord:
    return StepRecord(n, T0 + n, 5.0 - 0.1 * n, 1e-3, 1.0, 0.5, 4096.0, 0.1, 300.0, 0.1, 0.3, 0.05, 0.0, 0.0)


def lines(records) -> str:
    return "".join(json.dumps(r.to_json()) + "\n" for r in records)


def write_folder(root: Path, record: RunRecord = RECORD) -> Path:
    """A campaign of 2 x 4 steps: segment 0's job died at step 2 and was restarted; the restart runs step 3 and is
    appending step 4's record. Returns the checkpoint folder."""
    run = RunFolder(str(root), "", "", HASH)
    Path(run.run_record).parent.mkdir(parents=True)
    Path(run.run_record).write_text(json.dumps(record.to_json()))
    ckpts = root / RECORD.checkpoints
    ckpts.mkdir(parents=True)
    died = JobRun(0, 0, "17", T0 - 10, T0 - 5, T0 + 2.5, "died", "rank 1 died (SIGKILL) on nid002", "restart 1 of 3")
    Path(RunFolder.jobs_log(str(ckpts))).write_text(lines([replace(died, exclude=["nid002"])]))
    spans = [Span(0, "step", n, T0 + n, 0.5) for n in (0, 1)] + [Span(0, "step", 3, T0 + 3, 0.5)]
    Path(RunFolder.spans_log(str(ckpts))).write_text(lines(spans))
    Path(RunFolder.steps_log(str(ckpts))).write_text(lines(step(n) for n in range(4)) + '{"step": 4, "started"')
    Path(run.nccl_exclude).write_text("nid007\n")
    return ckpts


def test_a_segment_in_flight_shows_its_step_failure_and_hosts(tmp_path):
    write_folder(tmp_path)
    status = read_status(tmp_path, now=T0 + 4.0)
    assert status.state is State.RUNNING and status.in_flight == 0 and status.done == []
    assert (status.step, status.total_steps) == (4, 8)  # the half-written step 4 is left out
    assert status.step_s == 0.5 and status.tokens_per_s == 4096.0 and status.last_step_age_s == pytest.approx(0.5)
    assert status.eta_s == pytest.approx(4 * 0.5)
    assert [(f.outcome, f.verdict) for f in status.failures] == [("died", "restart 1 of 3")] and status.restarts == 1
    assert status.excluded == ["nid002", "nid007"]
    # steps 0, 1 and 3 and the bookkeeping from step 0 to 1 (2 s) over the wall from the first job's submission to
    # now (the running job counted from its first span, step 3's, after the failed job ended)
    assert status.wall_s == pytest.approx(14.0) and status.goodput == pytest.approx(2.0 / 14.0)
    assert status.checkpoint is None


def test_a_host_slurm_returned_shows_apart_from_the_hosts_still_out(tmp_path):
    ckpts = write_folder(tmp_path)
    died = JobRun(0, 0, "17", T0 - 10, T0 - 5, T0 + 2.5, "died", "rank 1 died (SIGKILL) on nid002", "restart 1 of 3")
    Path(RunFolder.jobs_log(str(ckpts))).write_text(lines([replace(died, exclude=["nid002"], left_out=["nid002"])]))
    back = HostEvent("nid002", T0 + 3, HostEventKind.RETURNED, "Slurm rebooted it at 2023-11-14T22:13:22", "job 17")
    Path(RunFolder.hosts_log(str(ckpts))).write_text(lines([back]))
    status = read_status(tmp_path, now=T0 + 4.0)
    assert status.excluded == ["nid007"] and status.returned == [back]
    assert f"\n  Returned: nid002 at {clock(T0 + 3)}: Slurm rebooted it at" in render(status, bar=False)


def test_the_command_prints_lines_and_json_without_torch(tmp_path):
    write_folder(tmp_path)
    code = (
        "import sys; from trainflow.status.__main__ import main; rc = main(sys.argv[1:]); "
        "assert 'torch' not in sys.modules, 'imported torch'; sys.exit(rc)"
    )
    text = subprocess.run([sys.executable, "-c", code, str(tmp_path)], capture_output=True, text=True, check=True)
    assert "running: segment 0 of 2, 0 done" in text.stdout and "step 4/8" in text.stdout
    assert "Failed: segment 0 job 17 died: rank 1 died (SIGKILL) on nid002" in text.stdout
    assert "verdict: restart 1 of 3" in text.stdout and "Excluded hosts: nid002, nid007" in text.stdout
    out = subprocess.run([sys.executable, "-c", code, str(tmp_path), "--json"], capture_output=True, text=True)
    data = json.loads(out.stdout)
    assert data["state"] == "running" and data["step"] == 4 and data["checkpoint"] is None


def hostile(root: Path, ckpts: Path, case: str) -> str:
    """Alter the folder as `case` says; the words the one error line must hold."""
    run_json, steps = Path(RunFolder(str(root), "", "", HASH).run_record), Path(RunFolder.steps_log(str(ckpts)))
    if case == "bad json":
        steps.write_text(lines([step(0)]) + "{not json\n" + lines([step(2)]))
        return "steps.jsonl:2 is not a JSON line"
    if case == "huge number":
        steps.write_text(lines([step(0)]) + '{"step": ' + "9" * 5000 + "}\n")
        return "steps.jsonl:2 is not a JSON line"
    if case == "huge step":
        steps.write_text(lines([replace(step(0), step=10**30)]))
        return f"holds step {10**30}, outside the campaign's 0..7"
    if case == "huge campaign":
        run_json.write_text(json.dumps(replace(RECORD, segments=10**20).to_json()))
        return "claims 100000000000000000000 x 4 steps"
    if case == "path outside":
        run_json.write_text(json.dumps(replace(RECORD, checkpoints="../../../etc").to_json()))
        return "outside"
    if case == "wrong type":
        steps.write_text(lines([step(0)]) + json.dumps({**step(1).to_json(), "loss": "low"}) + "\n")
        return "steps.jsonl:2.loss holds 'low', not a float"
    if case == "escape in a host":
        Path(RunFolder.jobs_log(str(ckpts))).write_text(
            json.dumps(JobRun(0, 0, "1", T0, T0, T0, "died", exclude=["x\u001b[2Jy"]).to_json()) + "\n"
        )
        return "names the host 'x\\x1b[2Jy' to leave out"
    return not_a_file(root, ckpts, case)


def not_a_file(root: Path, ckpts: Path, case: str) -> str:
    """Issue 43, case 6: a FIFO run.json hung status for ever, a FIFO or /dev/zero steps.jsonl read as empty ("0.0 %
    ... finished"), a symlink loop ended in a 30-line RuntimeError."""
    run_json, steps = Path(RunFolder(str(root), "", "", HASH).run_record), Path(RunFolder.steps_log(str(ckpts)))
    exclude = Path(RunFolder(str(root), "", "", HASH).nccl_exclude)
    made = {
        "fifo run.json": (run_json, os.mkfifo, "run.json is a FIFO, not a regular file"),
        "fifo steps": (steps, os.mkfifo, "steps.jsonl is a FIFO, not a regular file"),
        "dev-zero steps": (steps, lambda p: p.symlink_to("/dev/zero"), "steps.jsonl is a device or socket, not a "),
        "looping steps": (
            steps,
            lambda p: p.symlink_to(p),
            "steps.jsonl cannot be opened (Too many levels of symbolic",
        ),
        "fifo exclusions": (exclude, os.mkfifo, "nccl-exclude.txt is a FIFO, not a regular file"),
        "looping checkpoints": (ckpts, lambda p: p.symlink_to(p), "do not resolve under"),
    }
    path, make, words = made[case]
    shutil.rmtree(path) if path.is_dir() else path.unlink()
    make(path)
    return words


@pytest.mark.parametrize(
    "case",
    ["bad json", "huge number", "huge step", "huge campaign", "path outside", "wrong type", "escape in a host"]
    + ["fifo run.json", "fifo steps", "dev-zero steps", "looping steps", "fifo exclusions", "looping checkpoints"],
)
def test_a_hostile_run_folder_ends_in_one_line(tmp_path, capsys, case):
    want = hostile(tmp_path, write_folder(tmp_path), case)
    assert main([str(tmp_path)]) == 1
    out, err = capsys.readouterr()
    assert out == "" and err.count("\n") == 1 and err.startswith("trainflow.status: "), err
    assert want in err and "\u001b" not in err


def test_a_folder_without_a_campaign_says_so(tmp_path, capsys):
    assert main([str(tmp_path)]) == 1
    assert "holds neither train/<series>/run.json nor logs/: it is no run folder" in capsys.readouterr().err
    assert main([str(tmp_path / "missing")]) == 1
    assert "is no folder" in capsys.readouterr().err


def test_a_campaign_still_preparing_data_has_an_exit_status_of_its_own(tmp_path, capsys, monkeypatch):
    """Issue 43, case 8: it exited 1 with "no training job has started there", as a folder that is no run folder
    does; a polling script could not tell them apart. --watch waits for its training to start."""
    Path(RunFolder(str(tmp_path), "", "", HASH).log("prepare_data", "shard-00000")).parent.mkdir(parents=True)
    assert main([str(tmp_path)]) == NOT_STARTED == 3
    (line,) = capsys.readouterr().err.splitlines()
    assert line.startswith(f"trainflow.status: {tmp_path} is a run folder whose training has not started: ")
    naps = []

    def nap(seconds: float) -> None:  # training starts during the first wait; the second is interrupted
        naps.append(seconds)
        if len(naps) == 1:
            write_folder(tmp_path)
        else:
            raise KeyboardInterrupt

    monkeypatch.setattr("trainflow.status.__main__.time.sleep", nap)
    assert main([str(tmp_path), "--watch", "1"]) == 0
    out, err = capsys.readouterr()
    assert naps == [1.0, 1.0] and "has not started" in err and "running: segment 0 of 2" in out


def test_watch_refreshes_until_interrupted_and_refuses_a_bad_period(tmp_path, capsys, monkeypatch):
    write_folder(tmp_path)
    naps = []

    def nap(seconds: float) -> None:
        naps.append(seconds)
        if len(naps) == 2:
            raise KeyboardInterrupt

    monkeypatch.setattr("trainflow.status.__main__.time.sleep", nap)
    assert main([str(tmp_path), "--watch", "2.5"]) == 0
    assert naps == [2.5, 2.5] and capsys.readouterr().out.count("running: segment 0 of 2") == 2
    with pytest.raises(SystemExit):
        main([str(tmp_path), "--watch", "nan"])
    assert "--watch(nan) must be a number of seconds > 0" in capsys.readouterr().err


def test_a_segment_whose_last_job_failed_is_between_jobs_and_one_never_started_waits(tmp_path):
    ckpts = write_folder(tmp_path)
    jobs = Path(RunFolder.jobs_log(str(ckpts)))
    gave_up = JobRun(0, 1, "18", T0 + 3, T0 + 3, T0 + 9, "raised", "ValueError on every rank", "not restarted: ...")
    jobs.write_text(jobs.read_text() + lines([gave_up]))
    status = read_status(tmp_path, now=T0 + 20)
    assert status.state is State.BETWEEN_JOBS and status.restarts == 1 and len(status.failures) == 2
    assert status.eta_s == pytest.approx(2.0) and status.wall_s == pytest.approx(
        19.0
    )  # first submission (-10 s) to last end (9 s)

    for log in ckpts.iterdir():
        log.unlink()
    assert read_status(tmp_path).state is State.WAITING


def test_the_newest_evaluation_shows_its_scores(tmp_path):
    write_folder(tmp_path)
    assert "Evaluation: none yet" in render(read_status(tmp_path, now=T0 + 4.0), bar=False)
    run = RunFolder(str(tmp_path), "", "", HASH)
    corpus = TaskScore("corpus", TaskKind.CHOICE, 16, 0.375, 0.3125)
    for segment, step in ((0, 4), (1, 8)):
        record = EvalRecord(HASH, step, step * 2048, [corpus, TaskScore("gen", TaskKind.GENERATE, 2, 0.5, None)], 1.0)
        Path(run.evaluation(segment)).parent.mkdir(parents=True, exist_ok=True)
        Path(run.evaluation(segment)).write_text(json.dumps(record.to_json()))
    shown = render(read_status(tmp_path, now=T0 + 4.0), bar=False)
    assert "Evaluation: step 8 (16,384 tokens): corpus acc 0.375, acc_norm 0.312; gen acc 0.500" in shown
