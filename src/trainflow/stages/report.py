"""The campaign report: loss, throughput, MFU, time breakdown, checkpoints, NCCL gate, energy, checklist.

    python -m trainflow.stages.report 'io.segment_reports=[...]' io.report=runs/default/report/report.md

Markdown with PNG plots beside it; every stage's output is linked by a path relative to the report.
"""

from __future__ import annotations

import os
from pathlib import Path

import hydra
import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
from omegaconf import DictConfig  # noqa: E402

from trainflow.atomic import atomic_path, write_text_atomic  # noqa: E402
from trainflow.config import CONF_DIR, TrainflowConfig  # noqa: E402
from trainflow.config.run_folder import PLOTS  # noqa: E402
from trainflow.energy.accounting import stage_label  # noqa: E402
from trainflow.energy.phases import mean_gpu_busy_pct, power_series, trace_host  # noqa: E402
from trainflow.plan.versus import measured_split, side_by_side  # noqa: E402
from trainflow.stage import StageError, read_json, run_stage, stage_log  # noqa: E402

log = stage_log(__file__)


def plot_loss(steps: list[dict], evals: list[dict], out: Path) -> None:
    fig, ax = plt.subplots(figsize=(7, 4))
    ax.plot([r["step"] + 1 for r in steps], [r["loss"] for r in steps], label="train", lw=1)
    ax.plot([e["step"] for e in evals], [e["val_loss"] for e in evals], "o-", label="validation")
    ax.set(xlabel="step", ylabel="cross-entropy (nats/token)", title="Loss")
    ax.legend()
    ax.grid(alpha=0.3)
    fig.tight_layout()
    with atomic_path(out) as tmp:
        fig.savefig(tmp, dpi=110, format="png")
    plt.close(fig)


def plot_throughput(steps: list[dict], out: Path) -> None:
    fig, ax = plt.subplots(figsize=(7, 4))
    ax.plot([r["step"] + 1 for r in steps], [r["tokens_per_s"] for r in steps], lw=1)
    ax.set(xlabel="step", ylabel="tokens/s (all devices)", title="Throughput")
    ax.grid(alpha=0.3)
    fig.tight_layout()
    with atomic_path(out) as tmp:
        fig.savefig(tmp, dpi=110, format="png")
    plt.close(fig)


BREAKDOWN = (
    ("data_s", "data loading"),
    ("compute_s", "compute"),
    ("dp_comm_s", "exposed DP comm"),
    ("bubble_s", "pipeline bubble"),
    ("activation_s", "activation send/recv"),
)


def breakdown(steps: list[dict]) -> dict[str, float]:
    """Share of step time in each part (the remainder: optimizer, clipping, logging)."""
    total = sum(r["step_s"] for r in steps)
    shares = {label: sum(r[key] for r in steps) / total for key, label in BREAKDOWN}
    shares["optimizer and other"] = max(1 - sum(shares.values()), 0.0)
    return shares


def plot_breakdown(steps: list[dict], out: Path) -> None:
    x = [r["step"] + 1 for r in steps]
    fig, ax = plt.subplots(figsize=(7, 4))
    ax.stackplot(x, *[[r[key] * 1e3 for r in steps] for key, _ in BREAKDOWN], labels=[label for _, label in BREAKDOWN])
    ax.set(xlabel="step", ylabel="ms per step", title="Step time breakdown")
    ax.legend(loc="upper right", fontsize=8)
    fig.tight_layout()
    with atomic_path(out) as tmp:
        fig.savefig(tmp, dpi=110, format="png")
    plt.close(fig)


def table(rows: list[list[object]], header: list[str]) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(str(c) for c in row) + " |" for row in rows]
    return "\n".join(lines)


def checklist(nccl: dict, segments: list[dict], energy: dict, cfg: TrainflowConfig) -> list[list[str]]:
    """The seed's tuning checklist, each item measured here or marked not applicable, never assumed."""
    summary = segments[-1]
    busy = mean_gpu_busy_pct([trace for seg in energy["segments"] for trace in seg["power_traces"]])
    best = nccl["sweep"][-1]["busbw_gbps"] if nccl["sweep"] else None
    swap = [h["node"]["no_swapping"] for h in nccl["hosts"]]
    gpu, gate = cfg.cluster.runtime.device == "cuda", cfg.cluster.gate.min_busbw_gbps
    return [
        [
            f"collective bandwidth >= {gate:g} GB/s (cluster.gate.min_busbw_gbps)",
            f"{best:.3f} GB/s" if best is not None else "world size 1",
            "n/a" if best is None else ("pass" if best >= gate else "FAIL"),
        ],
        [
            "GPU utilisation >= 90 % (NVML's busy time over the segments' power samples, not MFU)",
            "-" if busy is None else f"{busy:.1f} %",
            ("n/a (CPU)" if not gpu else "no NVML samples") if busy is None else ("pass" if busy >= 90 else "FAIL"),
        ],
        ["model FLOPs utilisation (MFU)", f"{summary['mfu']:.1%} of cluster.hardware.peak_tflops", "info"],
        [
            "no host swapping",
            f"swap used {[h['node']['swap_used_kb'] for h in nccl['hosts']]} kB",
            "pass" if all(swap) else "FAIL",
        ],
        ["NVLink utilisation monitored", "-", "n/a (CPU)" if not gpu else "see NVML counters"],
        *node_rows(nccl),
        profiled(summary),
        leak_check(segments, cfg.observe.leak_mb),
    ]


def node_rows(nccl: dict) -> list[list[str]]:
    """validate_nccl's node checks over every host: THP, MPS, GPU clock slowdowns, the checkpoint's stripes."""
    nodes = {h["host"]: h["node"] for h in nccl["hosts"]}
    facts = {key: {host: n.get(key) for host, n in nodes.items()} for key in ("thp", "mps_daemon", "gpu_slowdowns")}
    why_no_gpu = next(iter(nodes.values())).get("gpu_why") or "no GPU"
    stripes = nccl.get("checkpoint_stripes", {})
    return [
        per_host("transparent huge pages off", facts["thp"], lambda v: v == "never", "unreadable here"),
        per_host("no MPS daemon (one process per GPU)", facts["mps_daemon"], lambda v: not v, "unreadable here"),
        per_host(
            "no GPU clock slowdown (NVML: thermal, power brake)",
            facts["gpu_slowdowns"],
            lambda v: not any(v),
            why_no_gpu,
        ),
        [
            "checkpoint folder's Lustre stripe count",
            "-" if stripes.get("count") is None else str(stripes["count"]),
            stripes.get("source", "n/a") if stripes.get("count") is None else "pass (validate_nccl gates it)",
        ],
    ]


def per_host(item: str, values: dict, good, why_unknown: str) -> list[str]:
    """A checklist row of one fact per host: pass, FAIL naming the hosts, or n/a with the reason."""
    known = {host: v for host, v in values.items() if v is not None}
    if not known:
        return [item, "-", f"n/a ({why_unknown})"]
    bad = sorted(host for host, v in known.items() if not good(v))
    measured = ", ".join(f"{host}: {v}" for host, v in sorted(known.items()))
    return [item, measured, f"FAIL on {', '.join(bad)}" if bad else "pass"]


def profiled(summary: dict) -> list[str]:
    if not summary.get("profile"):
        return ["PyTorch profiler trace analysed", "-", "off (observe.profile=false)"]
    top = summary["profile"]["top"][0]
    return ["PyTorch profiler trace analysed", f"top operator {top['name']} ({top['share']:.0%} of self time)", "pass"]


def gate_patterns(patterns: list[dict]) -> list[str]:
    """The layout's collectives as validate_nccl timed them on their own groups (trainflow.parallel.gate)."""
    if not patterns:
        return []
    rows = [
        [
            f"`{r['pattern']}`",
            f"{r['groups']} x {r['group_size']}",
            r["bytes"],
            f"{r['busbw_gbps']:.3f}",
            ", ".join(r["slowest_hosts"]),
            "-" if r["threshold_gbps"] is None else f"{r['threshold_gbps']:g}",
            {True: "pass", False: "FAIL", None: "reported"}[r["passed"]],
        ]
        for r in patterns
    ]
    header = ["pattern", "groups x ranks", "bytes", "slowest group's busbw GB/s", "its hosts", "gate", "status"]
    return ["### Per pattern, on the layout's groups", "", table(rows, header), ""]


def planned_vs_measured(plan: dict | None, steps: list[dict], last: dict) -> list[str]:
    """validate_nccl's plan of pipeline rank 0 beside rank 0's measured medians (trainflow.plan.versus)."""
    if not plan:
        return []
    rows = side_by_side(plan["step"]["per_pp_rank"][0], measured_split(steps), layout=last["layout"])
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
        "### Planned vs measured (validate_nccl's plan, pipeline rank 0; medians of rank 0's steps)",
        "",
        table(cells, ["measured part", "plan's parts", "planned s", "measured s", "planned / measured"]),
        "",
        f"Planned {plan['step']['tokens_per_s_per_device']:.0f} tokens/s/device at MFU {plan['step']['mfu']:.1%}; "
        f"measured {last['tokens_per_s_per_device']:.0f} at {last['mfu']:.1%}.",
        "",
    ]


def top_operators(profile: dict | None, here: Path) -> list[str]:
    """The profiled steps' operators by self time on rank 0 (observe.profile=true), as report lines."""
    if not profile:
        return []
    rows = [[f"`{op['name']}`", f"{op['self_ms']:.2f}", f"{op['share']:.1%}", op["calls"]] for op in profile["top"]]
    return [
        f"### Top operators by {profile['clock']} self time (rank 0, [trace]({relative(profile['trace'], here)}))",
        "",
        table(rows, ["operator", "self ms", "share", "calls"]),
        "",
    ]


def leak_check(segments: list[dict], leak_mb: float) -> list[str]:
    """Rank 0's memory growth from each segment's second step to its last (the first allocates for good)."""
    measured = [s["steps"] for s in segments if len(s["steps"]) > 2 and "memory_mb" in s["steps"][1]]
    growth = [steps[-1]["memory_mb"] - steps[1]["memory_mb"] for steps in measured]
    item = f"no memory leak (growth <= observe.leak_mb = {leak_mb:g} MB per segment)"
    if not growth:
        return [item, "-", "n/a (segments of 2 steps or fewer)"]
    worst = max(growth)
    remedy = "FAIL: find the kernel with CUDA_LAUNCH_BLOCKING=1, read torch.cuda.memory_summary()"
    return [item, f"{worst:+.1f} MB", "pass" if worst <= leak_mb else remedy]


def fp8_text(fp8: dict | None) -> str:
    """**off**, or **delayed** (GEMMs on kernel): the recipe and which fp8_gemm implementation ran."""
    if not fp8 or fp8["recipe"] == "none":
        return "**off**"
    return f"**{fp8['recipe']}** (GEMMs on {fp8['backend']})"


def data_parallel(layout: dict) -> str:
    """dp4 (replicate), dp4 (shard), or dp4 (HSDP: 2 replicas x shard 2)."""
    dp, mode, shard = layout["dp"], layout.get("dp_mode", "replicate"), layout.get("dp_shard", layout["dp"])
    if mode == "shard" and 1 < shard < dp:
        return f"dp{dp} (HSDP: {dp // shard} replicas x shard {shard})"
    return f"dp{dp} ({mode})"


def plot_power(segments: list[dict], cpu_watts_per_core: float, out: Path) -> None:
    fig, ax = plt.subplots(figsize=(7, 4))
    for seg in segments:
        for path in seg["power_traces"]:
            times, watts, source = power_series(path, cpu_watts_per_core)
            label = f"segment {seg['segment']}, {trace_host(path)} ({source})"
            ax.plot(times, watts, lw=1, label=label)
    ax.set(xlabel="seconds since the segment's sampler started", ylabel="W per node", title="Power per node")
    ax.legend(fontsize=7)
    ax.grid(alpha=0.3)
    fig.tight_layout()
    with atomic_path(out) as tmp:
        fig.savefig(tmp, dpi=110, format="png")
    plt.close(fig)


def energy_section(energy: dict, cfg: TrainflowConfig, plots: dict[str, str], here: Path) -> list[str]:
    """Energy per stage, per segment and phase, facility energy and carbon, Slurm's counter, DVFS and the cap."""
    t, d, e = energy["training"], energy["dvfs"], cfg.energy
    stage_rows = [
        [stage_label(s), f"{s['wall_s']:.1f}", f"{s['it_j']:.1f}", s["cpu_source"], s["gpu_source"]]
        for s in energy["stages"]
    ]
    phase_rows = [
        [
            seg["segment"],
            p["phase"],
            f"{p['seconds']:.2f}",
            f"{p['it_j']:.1f}",
            f"{p['it_j'] / seg['it_j']:.1%}" if seg["it_j"] else "-",
            p["cpu_source"],
            p["gpu_source"],
        ]
        for seg in energy["segments"]
        for p in seg["phases"]
    ]
    power_rows = []
    for seg in energy["segments"]:
        for path in seg["power_traces"]:
            _, watts, source = power_series(path, e.cpu_watts_per_core)
            if watts:
                row = [seg["segment"], trace_host(path), len(watts) + 1]
                power_rows.append([*row, f"{sum(watts) / len(watts):.1f}", f"{max(watts):.1f}", source])
    if "power" in plots:
        plot_power(energy["segments"], e.cpu_watts_per_core, Path(plots["power"]))
    slurm = [
        [s["stage"], s["job_id"], s["status"], fmt_j(s["consumed_j"]), f"{s['meter_j']:.1f}", fmt_j(s["difference_j"])]
        for s in energy["slurm"]
    ]
    lowered = (
        f"ran {d['lowered_phases']} data phases ({d['lowered_s']:.2f} s) at {d['idle_clock_mhz']} MHz"
        if d["lowered_phases"]
        else f"lowered no clock: of {d['data_loading_s']:.2f} s of data loading no phase followed one that lasted "
        f"energy.dvfs_min_phase_s = {e.dvfs_min_phase_s:g} s (a clock change takes the driver milliseconds)"
    )
    return [
        "## Energy",
        "",
        "Sources: `nvml` and `rapl` are counters read once per node (by its local rank 0), `slurm` is Slurm's "
        "accounting, `model: ...` is an estimate from the stated power x time model of `conf/energy/`.",
        "",
        table(stage_rows, ["stage", "wall s", "IT J", "CPU source", "GPU source"]),
        "",
        "### Training segments by phase",
        "",
        "Phases are the trainer's own markers (rank 0's step records and checkpoint saves); `other` is start-up, "
        "evaluation and waiting.",
        "",
        table(phase_rows, ["segment", "phase", "seconds", "IT J", "share", "CPU source", "GPU source"]),
        "",
        *([table(power_rows, ["segment", "node", "samples", "mean W", "peak W", "source"]), ""] if power_rows else []),
        *([f"![power]({relative(plots['power'], here)})", ""] if "power" in plots else []),
        f"Run total: IT {energy['total']['it_j']:.1f} J, facility {energy['total']['facility_j']:.1f} J at PUE "
        f"{energy['pue']}, {energy['total']['co2_g']:.4f} g CO2 at {energy['grid_gco2_per_kwh']} g/kWh. Training: "
        f"{t['it_j']:.1f} J IT ({t['facility_j']:.1f} J facility), {t['tokens']} tokens, "
        f"{t['tokens_per_it_joule'] or 0:.1f} tokens/J IT ({t['tokens_per_facility_joule'] or 0:.1f} per facility J), "
        f"{t['device_hours']:.4f} {t['device']}-hours.",
        "",
        "Slurm's ConsumedEnergy beside the meter: " + ("not a Slurm job here (local executor)." if not slurm else ""),
        "",
        *([table(slurm, ["stage", "job", "Slurm", "Slurm J", "meter J", "Slurm - meter J"]), ""] if slurm else []),
        "Power cap and DVFS: " + ("; ".join(energy["actions"]) or "none configured") + ".",
        f"DVFS {'applied' if d['applied'] else 'not applied'}: the policy {lowered}; estimated saving "
        f"{d['estimated_saving_j']:.1f} J ({d['basis']}). [energy.json]({relative(cfg.io.energy_report, here)})",
        "",
    ]


def fmt_j(joules: float | None) -> str:
    return "-" if joules is None else f"{joules:.1f}"


def relative(path: str, start: Path) -> str:
    return os.path.relpath(Path(path).resolve(), start.resolve())


def run(cfg: TrainflowConfig) -> dict:
    out = Path(cfg.io.report)
    out.parent.mkdir(parents=True, exist_ok=True)
    segments = [read_json(p) for p in cfg.io.segment_reports]
    if not segments:
        raise StageError("io.segment_reports is empty: pass the train_segment outputs")
    nccl, verify, energy = (
        read_json(cfg.io.nccl_report),
        read_json(cfg.io.verify_report),
        read_json(cfg.io.energy_report),
    )
    steps = [r for s in segments for r in s["steps"]]
    evals = sorted({e["step"]: e for s in segments for e in s["evals"]}.values(), key=lambda e: e["step"])
    if len(cfg.io.plots) != len(PLOTS):
        raise StageError(f"io.plots({cfg.io.plots}) must name {len(PLOTS)} files: the {', '.join(PLOTS)} plots")
    plots = dict(zip(PLOTS, cfg.io.plots))
    plot_loss(steps, evals, Path(plots["loss"]))
    plot_throughput(steps, Path(plots["throughput"]))
    plot_breakdown(steps, Path(plots["breakdown"]))
    last = segments[-1]
    first_val, final_val = evals[0]["val_loss"], evals[-1]["val_loss"]
    here = out.parent
    seg_rows = [
        [
            s["segment"],
            f"{s['start_step']}-{s['end_step']}",
            f"{s['steps'][-1]['loss']:.4f}" if s["steps"] else "-",
            f"{s['evals'][-1]['val_loss']:.4f}",
            f"{s['tokens_per_s_per_device']:.0f}",
            f"{s['mfu']:.2%}",
            s["restart_count"],
            s["checkpoint_interval"]["interval_steps"],
            f"[json]({relative(p, here)})",
        ]
        for s, p in zip(segments, cfg.io.segment_reports)
    ]
    ci = last["checkpoint_interval"]
    lines = [
        f"# trainflow report: run `{cfg.run}`",
        "",
        f"Model `{cfg.model.name}` ({last['n_params'] / 1e6:.2f} M parameters), layout "
        f"{data_parallel(last['layout'])} x "
        f"tp{last['layout']['tp']} x pp{last['layout']['pp']} ({last['layout']['schedule']}, v={last['layout']['v']}, "
        f"m={last['layout']['microbatches']}) on {last['world_size']} {cfg.cluster.runtime.device} rank(s), "
        f"backend {cfg.cluster.runtime.backend}. Precision **{last['precision']}**, activations "
        f"**{last['activations']}**, "
        f"torch.compile **{'on' if last['compile'] else 'off'}**, FP8 {fp8_text(last.get('fp8'))}.",
        "",
        "## Training",
        "",
        f"Validation loss went from **{first_val:.4f}** at step 0 to **{final_val:.4f}** at step {evals[-1]['step']} "
        f"(ratio {final_val / first_val:.3f}).",
        "",
        table(
            seg_rows,
            [
                "segment",
                "steps",
                "train loss",
                "val loss",
                "tokens/s/device",
                "MFU",
                "restarts",
                "ckpt interval",
                "report",
            ],
        ),
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
            if cfg.parallel.overlap and 1 < last["layout"]["dp"] == last["world_size"]
            else []
        ),
        f"![breakdown]({relative(plots['breakdown'], here)})",
        "",
        *planned_vs_measured(nccl.get("plan"), steps, last),
        *top_operators(last.get("profile"), here),
        "## Checkpoints",
        "",
        f"Interval policy **{ci['policy']}**: {ci['interval_steps']} steps (save {ci['save_s']:.2f} s measured, "
        f"step {ci['step_s']:.3f} s measured, MTBF {ci['mtbf_s'] / 3600:.1f} h"
        + (f", Young/Daly interval {ci['interval_s']:.1f} s" if ci.get("interval_s") else "")
        + ").",
        f"Verified {verify['files']} files in {len(verify['checkpoints'])} checkpoints "
        f"({verify['bytes'] / 1e6:.1f} MB, {verify['algorithm']}): {len(verify['failures'])} mismatches. "
        f"[verify.json]({relative(cfg.io.verify_report, here)})",
        "",
        "## Collective network gate",
        "",
        table(
            [
                [r["bytes"], f"{r['time_s'] * 1e3:.3f}", f"{r['algbw_gbps']:.3f}", f"{r['busbw_gbps']:.3f}"]
                for r in nccl["sweep"]
            ],
            ["bytes", "ms", "algbw GB/s", "busbw GB/s"],
        ),
        "",
        f"Threshold {nccl['threshold_gbps']} GB/s: {'passed' if nccl['passed'] else 'FAILED'}. Environment warnings: "
        f"{'; '.join(nccl['env_warnings']) or 'none'}. [nccl.json]({relative(cfg.io.nccl_report, here)})",
        "",
        *gate_patterns(nccl.get("patterns", [])),
        *energy_section(energy, cfg, plots, here),
        "## Tuning checklist (seed)",
        "",
        table(checklist(nccl, segments, energy, cfg), ["item", "measured", "status"]),
        "",
        "## Stage outputs",
        "",
        f"- tokens (capacity tier): `{cfg.io.tokens}`",
        f"- tokens (fast tier): `{cfg.io.staged_tokens}`",
        f"- checkpoints: `{cfg.io.checkpoints}`",
        *[f"- metrics: [{Path(p).name}]({relative(p, here)})" for p in cfg.io.metrics],
        "",
    ]
    write_text_atomic(out, "\n".join(lines))
    log.info("Wrote %s (validation loss %.4f -> %.4f)", out, first_val, final_val)
    return {}


@hydra.main(version_base="1.3", config_path=str(CONF_DIR), config_name="report")
def main(raw: DictConfig) -> None:
    run_stage(raw, run)


if __name__ == "__main__":
    main()
