"""The campaign's run-folder files as an attacker may write them (campaign.json, series.json, lineage.jsonl, a kept
summary, live-<i>.json): each hostile version fails in one line or is passed over, nothing runs, no process the record
names is signalled unless it is the job's own, and nothing is written outside the run folder."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.conftest import make_config, run_segment
from trainflow.campaign.check import check_campaign, start_series
from trainflow.campaign.segments import segment_span
from trainflow.config.run_folder import RunFolder
from trainflow.errors import TrainflowError
from trainflow.host import hostname
from trainflow.launch.live_job import LiveJob, LiveJobs, Process
from trainflow.records import RecordError
from trainflow.resilience.ledger import jobs_ledger
from trainflow.train.kept import restore_segment


@pytest.fixture
def started(tmp_path):
    cfg = make_config("train_segment", tmp_path)
    start_series(cfg)
    return cfg


@pytest.mark.parametrize(
    ("edit", "message"),
    [
        (lambda d: "{", "is not readable JSON"),
        (lambda d: {**d, "identity": "os.system('x')"}, "holds str, not a dict"),
        (lambda d: {**d, "format": 7}, "written by a newer trainflow"),
        (lambda d: {**d, "seed": "1"}, "holds '1', not a int"),
        (lambda d: "[" * 100000 + "]" * 100000, "is not readable JSON"),
    ],
)
def test_a_hostile_campaign_record_fails_in_one_line(started, edit, message):
    path = Path(RunFolder.of(started).campaign_record)
    data = edit(json.loads(path.read_text()))
    path.write_text(data if isinstance(data, str) else json.dumps(data))
    with pytest.raises(RecordError, match=message) as err:
        check_campaign(started)
    assert "\n" not in str(err.value)


def test_a_hostile_lineage_fails_in_one_line_or_trains_nothing(started):
    lineage = Path(RunFolder.lineage_log(started.io.checkpoints))
    lineage.write_text('{"segment": 0, "start_step": "x"}\n')
    with pytest.raises(RecordError, match=r"lineage\.jsonl:1"):
        segment_span(started)
    lineage.write_text(
        json.dumps({"segment": 0, "start_step": 0, "end_step": 10**15, "continued_from": "x", "code": None}) + "\n"
    )
    span = segment_span(make_config("train_segment", started.storage.root, "segment=1"))
    assert span.start == 10**15  # a segment after it finds no checkpoint at or before its end: one ResumeError line


def test_a_kept_summary_that_is_a_link_or_no_summary_fails_in_one_line(started, tmp_path):
    lineage = Path(RunFolder.lineage_log(started.io.checkpoints))
    lineage.write_text(
        json.dumps({"segment": 0, "start_step": 0, "end_step": 6, "continued_from": "x", "code": None}) + "\n"
    )
    kept = Path(RunFolder.kept_summary(started.io.checkpoints, 0))
    kept.parent.mkdir(parents=True)
    kept.symlink_to("/etc/passwd")
    with pytest.raises(RecordError, match="is not readable JSON") as err:
        restore_segment(started, segment_span(started))
    assert "\n" not in str(err.value) and not Path(started.io.segment_report).exists()


def live(cfg, **fields) -> Path:
    record = LiveJob(0, 0, "123", "local", 2, time.time(), [], waiter=Process("elsewhere", 1, 1), **fields)
    path = Path(RunFolder.live_job(cfg.io.checkpoints, 0))
    path.write_text(json.dumps(record.to_json()))
    return path


@pytest.mark.parametrize(
    "fields",
    [{"job_id": "1; touch /tmp/pwned"}, {"kind": "ssh"}, {"segment": 3}],
    ids=["command in the job id", "unknown kind", "another segment"],
)
def test_a_hostile_live_record_is_refused_in_one_line(started, fields):
    path = live(started)
    path.write_text(json.dumps({**json.loads(path.read_text()), **fields}))
    with pytest.raises(TrainflowError, match="the file was altered: delete it and rerun") as err:
        LiveJobs(started).attach()
    assert "\n" not in str(err.value) and not Path("/tmp/pwned").exists()


def test_a_live_record_naming_another_process_never_signals_it(started):
    """A record whose controller is a process of this host that is no job's controller (here a sleeping child, its
    start time right): the re-attached job reads as ended and cancelling it sends that process nothing."""
    bystander = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        live(started, controller=Process.of(bystander.pid))
        job, record = LiveJobs(started).attach()
        assert job.state != "RUNNING"  # its command line is no trainflow.launch of this folder: the job has ended
        job.cancel(check=False)
        job._interrupt()
        assert bystander.poll() is None  # alive: nothing was sent to it
        stale = live(started, controller=Process(hostname(), bystander.pid, 1))  # a pid reused since
        assert LiveJobs(started).attach()[0].state != "RUNNING" and stale.exists()
    finally:
        bystander.send_signal(signal.SIGKILL)
        bystander.wait()


def test_a_stale_live_record_is_taken_over_and_the_segment_trains(tmp_path, tokens, caplog):
    """The record of a job that is gone (its controller no process now) is judged as a job that ended without its
    results: one restart, the segment trains, the ledger says why."""
    cfg = make_config("train_segment", tmp_path, tokens=tokens)
    start_series(cfg)
    live(cfg, controller=Process(hostname(), 2**22 + 1, 1))
    summary = run_segment(tmp_path, tokens)
    assert summary["completed"] and "Re-attached to local job 123 of segment 0" in caplog.text
    jobs = jobs_ledger(cfg.io.checkpoints).read()
    assert [j.job_id for j in jobs][0] == "123" and jobs[0].outcome != "completed" and jobs[-1].outcome == "completed"
