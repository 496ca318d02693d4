"""A stage's run() reports a StageFigures record; run_stage writes it into the job's metrics (JobMetrics, its
fields and what was measured around it), and an altered metrics file fails in one line naming the file and field."""

from __future__ import annotations

import json

import pytest
from omegaconf import OmegaConf

from tests.conftest import make_config
from trainflow.energy.metrics import JobMetrics, StageFigures
from trainflow.records import RecordError, read_record
from trainflow.stage import run_stage


def test_run_stage_writes_the_figures_run_reported(tmp_path, monkeypatch):
    monkeypatch.setenv("SLURM_JOB_ID", "4242")
    cfg = make_config("verify_checkpoint", tmp_path)
    figures = StageFigures({"bytes": 7, "seconds": 0.5, "source": "corpus"}, ranks=2, rank_cpu_s=1.5, tokens=9)
    run_stage(OmegaConf.structured(cfg), lambda _: figures)
    metrics = read_record(JobMetrics, cfg.io.job_metrics)
    assert metrics.figures == figures.figures and (metrics.ranks, metrics.rank_cpu_s, metrics.tokens) == (2, 1.5, 9)
    assert metrics.stage == "verify_checkpoint" and metrics.wall_s >= 0 and metrics.slurm_job_id == "4242"
    run_stage(OmegaConf.structured(cfg), lambda _: StageFigures(slurm_job_id="17"))  # the ranks' own job
    assert read_record(JobMetrics, cfg.io.job_metrics).slurm_job_id == "17"


@pytest.mark.parametrize(
    ("change", "message"),
    [
        (lambda d: d["figures"].update(shards=[1]), r"m\.json\.figures\.shards holds \[1\], not a str"),
        (lambda d: d["figures"].update(done=True), r"m\.json\.figures\.done holds True, not a str"),
        (lambda d: d.update(ranks="2"), r"m\.json\.ranks holds '2', not a int"),
        (lambda d: d.pop("wall_s"), r"m\.json lacks JobMetrics's field 'wall_s'"),
        (lambda d: d.update(split_tokens={}), r"m\.json holds 'split_tokens', which JobMetrics has no field for"),
    ],
)
def test_an_altered_metrics_file_is_one_line_naming_the_file_and_the_field(tmp_path, change, message):
    measured = {"wall_s": 1.0, "cpu_s": 0.5, "rapl_j": None, "gpu_j": None, "host": "h", "config": {}}
    data = JobMetrics.of(StageFigures({"shards": 3}), stage="s", segment=0, job="s", **measured).to_json()
    change(data)
    path = tmp_path / "m.json"
    path.write_text(json.dumps(data))
    with pytest.raises(RecordError, match=message) as err:
        read_record(JobMetrics, path)
    assert "\n" not in str(err.value)
