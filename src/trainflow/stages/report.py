"""The campaign report: loss, throughput, MFU, time breakdown, checkpoints, downstream evaluations, goodput, NCCL gate,
software stack, energy, checklist.

    python -m trainflow.stages.report 'io.segment_reports=[...]' io.report=runs/default/report/report.md

Markdown with PNG plots beside it; every stage's output is linked by a path relative to the report. The stage reads
its inputs (each a typed record), draws the plots and joins the sections of trainflow.report.
"""

from __future__ import annotations

from pathlib import Path

from trainflow.atomic import write_text_atomic
from trainflow.checkpoint.verify import VerifyReport
from trainflow.config import TrainflowConfig
from trainflow.config.run_folder import PLOTS, RunFolder
from trainflow.energy.metrics import StageFigures
from trainflow.energy.report import EnergyReport
from trainflow.evaluate.records import EvalRecord as EvalScores
from trainflow.gate.report import NcclReport
from trainflow.plan.from_run import RunPlan, load_terms, plan_run
from trainflow.records import read_record
from trainflow.report import sections
from trainflow.report.checklist import checklist
from trainflow.report.energy import energy_section
from trainflow.report.evaluations import evaluations_section, phase_labels
from trainflow.report.goodput import goodput_section
from trainflow.report.lineage import changes_of, lineage_section
from trainflow.report.mixture import mixture_section
from trainflow.report.plots import (
    plot_breakdown,
    plot_evaluations,
    plot_goodput,
    plot_loss,
    plot_power,
    plot_throughput,
)
from trainflow.report.stack import stack_section
from trainflow.stage import StageError, stage_log, stage_main
from trainflow.train.report_log import log_report
from trainflow.train.summary import SegmentSummary

log = stage_log(__file__)


def planned_run(cfg: TrainflowConfig) -> RunPlan | None:
    """The campaign's goodput planned from its own terms (train_segment's terms.json), where it has them."""
    path = Path(RunFolder.of(cfg).run_terms)
    return plan_run(load_terms(path)) if path.is_file() else None


def run(cfg: TrainflowConfig) -> StageFigures:
    io = cfg.io
    out = Path(io.report)
    if not io.segment_reports:
        raise StageError("io.segment_reports is empty: pass the train_segment outputs")
    if len(io.plots) != len(PLOTS):
        raise StageError(f"io.plots({io.plots}) must name {len(PLOTS)} files: the {', '.join(PLOTS)} plots")
    segments = [read_record(SegmentSummary, p, rerun="train_segment") for p in io.segment_reports]
    nccl = read_record(NcclReport, io.nccl_report, rerun="validate_nccl")
    verify = read_record(VerifyReport, io.verify_report, rerun="verify_checkpoint")
    energy = read_record(EnergyReport, io.energy_report, rerun="account_energy")
    scores = [read_record(EvalScores, p, rerun="evaluate") for p in io.evaluations]
    steps = [r for s in segments for r in s.steps]
    evals = sorted({e.step: e for s in segments for e in s.evals}.values(), key=lambda e: e.step)
    plots = dict(zip(PLOTS, io.plots))
    plot_loss(steps, evals, Path(plots["loss"]), changes_of(segments))
    plot_throughput(steps, Path(plots["throughput"]))
    plot_breakdown(steps, Path(plots["breakdown"]))
    plot_power(energy.segments, cfg.energy.cpu_watts_per_core, Path(plots["power"]))
    plot_goodput(segments, Path(plots["goodput"]))
    plot_evaluations(scores, phase_labels(cfg), Path(plots["evaluations"]))
    last, here = segments[-1], out.parent
    rows = checklist(nccl, segments, energy, cluster=cfg.cluster, leak_mb=cfg.observe.leak_mb)
    lines = [
        *sections.header(cfg, last.setup),
        *sections.training(segments, io.segment_reports, evals, plots=plots, here=here, cfg=cfg),
        *lineage_section(segments),
        *mixture_section(segments, evals),
        *sections.planned_vs_measured(nccl.plan, steps, last),
        *sections.calibration(nccl.calibration),
        *sections.top_operators(last.profile, here),
        *sections.checkpoints(segments, verify, io.verify_report, here),
        *evaluations_section(scores, phase_labels(cfg), plot=plots["evaluations"], here=here),
        *goodput_section(
            segments, plots["goodput"], here, straggler_factor=cfg.resilience.straggler_factor, planned=planned_run(cfg)
        ),
        *sections.gate(nccl, io.nccl_report, here),
        *stack_section(nccl, segments),
        *energy_section(energy, cfg, plots["power"], here),
        "## Tuning checklist (seed)",
        "",
        sections.table(rows, ["item", "measured", "status"]),
        "",
        *sections.outputs(cfg, here),
    ]
    write_text_atomic(out, "\n".join(lines))
    log_report(cfg, "\n".join(lines))  # to the campaign's W&B and MLflow runs, when observe.* keeps them
    log.info("Wrote %s (validation loss %.4f -> %.4f)", out, evals[0].val_loss, evals[-1].val_loss)
    return StageFigures()


if __name__ == "__main__":
    stage_main(run, config_name="report")
