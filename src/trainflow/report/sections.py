"""The sections of report.md, one function each returning its lines (the energy section is report.energy's).

lines = training(segments, reports, plots=plots, here=out.parent, cfg=cfg)
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path

from trainflow.checkpoint.verify import VerifyReport
from trainflow.config import ParallelDims, TrainflowConfig
from trainflow.gate.report import Calibration, NcclReport
from trainflow.plan.build import Plan
from trainflow.plan.versus import measured_split, side_by_side
from trainflow.report.plots import BREAKDOWN
from trainflow.train.step_log import EvalRecord, StepRecord
from trainflow.train.summary import Fp8Use, ProfileSummary, SegmentSetup, SegmentSummary


def table(rows: Sequence[Sequence[object]], header: Sequence[str]) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(str(c) for c in row) + " |" for row in rows]
    return "\n".join(lines)


def relative(path: str, start: Path) -> str:
    return os.path.relpath(Path(path).resolve(), start.resolve())


def data_parallel(d: ParallelDims) -> str:
    """dp4 (replicate), dp4 (shard), or dp4 (HSDP: 2 replicas x shard 2)."""
    return (
        f"dp{d.dp} (HSDP: {d.dp // d.shard_size} replicas x shard {d.shard_size})"
        if d.hsdp
        else f"dp{d.dp} ({d.dp_mode})"
    )


def fp8_text(fp8: Fp8Use) -> str:
    """**off**, or **delayed** (GEMMs on sm90_kernel: why): the recipe, which fp8_gemm implementation ran and why."""
    if fp8.recipe == "none":
        return "**off**"
    return f"**{fp8.recipe}** (GEMMs on {fp8.reason or fp8.backend})"


def header(cfg: TrainflowConfig, setup: SegmentSetup) -> list[str]:
    d, c = setup.layout, cfg.cluster.runtime
    return [
        f"# trainflow report: run `{cfg.run}`",
        "",
        f"Model `{cfg.model.name}` ({setup.parameters / 1e6:.2f} M parameters), layout {data_parallel(d)} x tp{d.tp} x "
        f"pp{d.pp} ({d.schedule}, v={d.virtual_stages}, m={d.microbatches}) on {d.world_size} {c.device} rank(s), "
        f"backend {c.backend}. Precision **{setup.precision}**, activations **{setup.activations}**, torch.compile "
        f"**{'on' if setup.compile else 'off'}**, FP8 {fp8_text(setup.fp8)}.",
        "",
        *(
            [
                f"Step 0 was initialised from the Hugging Face weights in `{setup.init_from}` (io.init_from); the "
                "optimizer started fresh.",
                "",
            ]
            if setup.init_from
            else []
        ),
    ]


def breakdown(steps: Sequence[StepRecord]) -> dict[str, float]:
    """Share of step time in each part (the remainder: optimizer, clipping, logging)."""
    total = sum(r.step_s for r in steps)
    shares = {label: sum(getattr(r, key) for r in steps) / total for key, label in BREAKDOWN}
    shares["optimizer and other"] = max(1 - sum(shares.values()), 0.0)
    return shares


def training(
    segments: Sequence[SegmentSummary], reports: Sequence[str], evals: Sequence[EvalRecord], *, plots, here, cfg
) -> list[str]:
    """The loss, each segment's row, the loss and throughput plots, and where the step time went."""
    steps = [r for s in segments for r in s.steps]
    first, final = evals[0].val_loss, evals[-1].val_loss
    rows = [
        [
            s.segment,
            f"{s.start_step}-{s.end_step}",
            f"{s.steps[-1].loss:.4f}" if s.steps else "-",
            f"{s.evals[-1].val_loss:.4f}",
            f"{s.speed.tokens_per_s_per_device:.0f}",
            f"{s.speed.mfu:.2%}",
            s.restart_count,
            s.setup.checkpoint_interval.interval_steps,
            f"[json]({relative(p, here)})",
        ]
        for s, p in zip(segments, reports)
    ]
    header = ["segment", "steps", "train loss", "val loss", "tokens/s/device", "MFU", "restarts", "ckpt interval"]
    last = segments[-1].setup.layout
    ddp = cfg.parallel.overlap and 1 < last.dp == last.world_size
    return [
        "## Training",
        "",
        f"Validation loss went from **{first:.4f}** at step 0 to **{final:.4f}** at step {evals[-1].step} "
        f"(ratio {final / first:.3f}).",
        "",
        table(rows, [*header, "report"]),
        "",
        f"![loss]({relative(plots['loss'], here)})",
        "",
        f"![throughput]({relative(plots['throughput'], here)})",
        "",
        "### Where the step time went",
        "",
        table([[k, f"{v:.1%}"] for k, v in breakdown(steps).items()], ["part", "share"]),
        "",
        *(
            [
                "With torch's DDP (a pure data-parallel mesh) the wait for the last gradient bucket happens inside "
                "backward and is counted as compute.",
                "",
            ]
            if ddp
            else []
        ),
        f"![breakdown]({relative(plots['breakdown'], here)})",
        "",
    ]


def planned_vs_measured(plan: Plan, steps: Sequence[StepRecord], last: SegmentSummary) -> list[str]:
    """validate_nccl's plan of pipeline rank 0 beside rank 0's measured medians (trainflow.plan.versus)."""
    rows = side_by_side(plan.step.per_pp_rank[0], measured_split(steps), layout=last.setup.layout)
    cells = [
        [
            f"`{key}`",
            " + ".join(r["plan_parts"]) or "-",
            f"{r['predicted']:.4f}",
            f"{r['measured']:.4f}",
            f"{r['ratio']:.2f}" if r["ratio"] else "-",
        ]
        for key, r in rows.items()
    ]
    return [
        "### Planned vs measured (validate_nccl's plan on the constants it measured, pipeline rank 0; medians of "
        "rank 0's steps)",
        "",
        table(cells, ["measured part", "plan's parts", "planned s", "measured s", "planned / measured"]),
        "",
        f"Planned {plan.step.tokens_per_s_per_device:.0f} tokens/s/device at MFU {plan.step.mfu:.1%}; "
        f"measured {last.speed.tokens_per_s_per_device:.0f} at {last.speed.mfu:.1%}.",
        "",
    ]


def calibration(cal: Calibration | None) -> list[str]:
    """The constants validate_nccl measured for the plan above, beside the configured ones (gate.calibrate)."""
    if cal is None:
        return []
    rows = [
        [f"`{c.name}`", f"{c.configured:.4g}", f"{c.measured:.4g}", f"{c.ratio:.2f}", c.source] for c in cal.constants
    ]
    return [
        f"The plan's cluster.hardware constants as validate_nccl measured them on this allocation; the configured ones "
        f"planned {cal.configured_step_s:.4f} s per step.",
        "",
        table(rows, ["constant", "configured", "measured", "measured / configured", "how"]),
        "",
    ]


def top_operators(profile: ProfileSummary | None, here: Path) -> list[str]:
    """The profiled steps' operators by self time on rank 0 (observe.profile=true)."""
    if not profile:
        return []
    rows = [[f"`{op.name}`", f"{op.self_ms:.2f}", f"{op.share:.1%}", op.calls] for op in profile.top]
    return [
        f"### Top operators by {profile.clock} self time (rank 0, [trace]({relative(profile.trace, here)}))",
        "",
        table(rows, ["operator", "self ms", "share", "calls"]),
        "",
    ]


def checkpoints(segments: list[SegmentSummary], verify: VerifyReport, verify_path: str, here: Path) -> list[str]:
    """The interval and what it was planned from (the last segment's), the verification, and per save of every
    segment: the seconds training was blocked, the background write (async) and the wait for it, and the steps that
    ran beside the write against the segment's others (its first, warm-up, step left out)."""
    ci = segments[-1].setup.checkpoint_interval
    young_daly = f", Young/Daly interval {ci.interval_s:.1f} s" if ci.interval_s else ""
    floor = "" if ci.background_s is None else f", background write {ci.background_s:.2f} s: the interval's floor"
    lines = [
        "## Checkpoints",
        "",
        f"Interval policy **{ci.policy}**: {ci.interval_steps} steps (training blocked {ci.save_s:.3f} s a save "
        f"measured{floor}, step {ci.step_s:.3f} s measured, MTBF {ci.mtbf_s / 3600:.1f} h{young_daly}).",
        f"Verified {verify.files} files in {len(verify.checkpoints)} checkpoints ({verify.bytes / 1e6:.1f} MB, "
        f"{verify.algorithm}): {len(verify.failures)} mismatches. [verify.json]({relative(verify_path, here)})",
        "",
    ]
    rows = [row for summary in segments for row in save_rows(summary)]
    if not rows:
        return lines
    header = ["segment", "step", "blocking s", "background s", "waited s", "steps beside", "their mean s", "slowdown"]
    lines += [table(rows, header), ""]
    if any(s.background_s is not None for summary in segments for s in summary.saves):
        lines += ["Slowdown: the mean of the steps beside a background write over the segment's other steps.", ""]
    return lines


def save_rows(summary: SegmentSummary) -> list[list]:
    """A segment's saves as rows of the checkpoint table."""
    step_s = {r.step: r.step_s for r in summary.steps[1:]}
    during = {s.step + i for s in summary.saves for i in range(s.overlap_steps)}
    others = [t for step, t in step_s.items() if step not in during]
    other_s = sum(others) / len(others) if others else None
    rows = []
    for s in summary.saves:
        beside = [step_s[k] for k in range(s.step, s.step + s.overlap_steps) if k in step_s]
        mean = sum(beside) / len(beside) if beside else None
        rows.append(
            [
                summary.segment,
                s.step,
                f"{s.save_s:.3f}",
                "-" if s.background_s is None else f"{s.background_s:.3f}",
                f"{s.waited_s:.3f}",
                s.overlap_steps,
                "-" if mean is None else f"{mean:.4f}",
                "-" if mean is None or not other_s else f"{mean / other_s:.2f}x",
            ]
        )
    return rows


def gate(nccl: NcclReport, nccl_path: str, here: Path) -> list[str]:
    """The all_reduce sweep over the world and each pattern on the layout's groups (trainflow.gate)."""
    sweep = [[r.bytes, f"{r.time_s * 1e3:.3f}", f"{r.algbw_gbps:.3f}", f"{r.busbw_gbps:.3f}"] for r in nccl.sweep]
    lines = [
        "## Collective network gate",
        "",
        table(sweep, ["bytes", "ms", "algbw GB/s", "busbw GB/s"]),
        "",
        f"Threshold {nccl.threshold_gbps} GB/s: passed. Environment warnings: "
        f"{'; '.join(nccl.env_warnings) or 'none'}. [nccl.json]({relative(nccl_path, here)})",
        "",
    ]
    if not nccl.patterns:
        return lines
    rows = [
        [
            f"`{r.pattern}`",
            f"{r.groups} x {r.group_size}",
            r.bytes,
            f"{r.busbw_gbps:.3f}",
            ", ".join(r.slowest_hosts),
            "-" if r.threshold_gbps is None else f"{r.threshold_gbps:g}",
            {True: "pass", False: "FAIL", None: "reported"}[r.passed],
        ]
        for r in nccl.patterns
    ]
    header = ["pattern", "groups x ranks", "bytes", "slowest group's busbw GB/s", "its hosts", "gate", "status"]
    return [*lines, "### Per pattern, on the layout's groups", "", table(rows, header), ""]


def outputs(cfg: TrainflowConfig, here: Path) -> list[str]:
    return [
        "## Stage outputs",
        "",
        f"- tokens (capacity tier): `{cfg.io.tokens}`",
        f"- tokens (fast tier): `{cfg.io.staged_tokens}`",
        f"- checkpoints: `{cfg.io.checkpoints}`",
        *[f"- metrics: [{Path(p).name}]({relative(p, here)})" for p in cfg.io.run_metrics],
        "",
    ]
