"""Energy inside a training segment, split by phase: data loading, compute, checkpoint save, and the rest.

    rows = phase_energy(summary.steps, summary.saves, metrics.node_windows, stage_energy(metrics, ...))

The windows are the trainer's own markers, from rank 0's step records (wall-clock start, data loading
seconds, step seconds) and its checkpoint saves. A counter a node's sampler recorded (NVML `gpu_j`, RAPL
`rapl_j`) is integrated over those windows: each window's energy is the difference of the cumulative
counter interpolated at its ends, summed over nodes, so a window much shorter than the sample period gets
the period's mean power. A part without a counter is split by the stated model instead: GPUs x watts x
the phase's seconds, or the segment's modelled CPU energy in proportion to the phase's seconds.
"""

from __future__ import annotations

import bisect
import json
from collections import defaultdict
from collections.abc import Sequence
from pathlib import Path

from trainflow.energy.dvfs import PHASES, SaveMarks, StepMarks
from trainflow.energy.node import NodeReading
from trainflow.energy.report import PhaseEnergy, StageEnergy
from trainflow.records import JOURNAL_BYTES, RecordError, read_file


def phase_windows(steps: Sequence[StepMarks], saves: Sequence[SaveMarks]) -> dict[str, list[tuple[float, float]]]:
    """(start, end) wall-clock windows of each phase."""
    windows: dict[str, list[tuple[float, float]]] = {kind: [] for kind in PHASES}
    for r in steps:
        loaded = r.started + r.data_s
        windows["data"].append((r.started, loaded))
        windows["compute"].append((loaded, r.started + r.step_s))
    windows["checkpoint"] = [(s.started, s.started + s.save_s) for s in saves]
    return windows


def read_trace(path: str | Path) -> list[list[dict]]:
    """A node's samples, one list per sampler run (a requeued job appends a new run)."""
    runs: dict[float, list[dict]] = defaultdict(list)
    fix = "it was altered: move it away (the node's power is then modelled)"
    for n, line in enumerate(read_file(path, fix=fix, limit=JOURNAL_BYTES).splitlines(), 1):
        if not line.strip():
            continue
        try:
            sample = json.loads(line)
            runs[float(sample["since"])].append({**sample, "t": float(sample["t"])})
        except (ValueError, RecursionError, KeyError, TypeError) as err:  # no JSON object of a sample's numbers
            raise RecordError(f"{path}:{n} is no power sample ({type(err).__name__}); {fix}") from None
    return [sorted(run, key=lambda s: s["t"]) for _, run in sorted(runs.items())]


def counter_between(runs: list[list[dict]], key: str, start: float, end: float) -> float:
    """The cumulative counter `key` gained in [start, end], linearly interpolated inside the run that covers it
    (0 where no run does: the sampler was not running)."""
    for run in runs:
        times = [s["t"] for s in run]
        if key in run[0] and times[0] <= start and end <= times[-1]:
            return at(run, times, key, end) - at(run, times, key, start)
    return 0.0


def at(run: list[dict], times: list[float], key: str, t: float) -> float:
    i = min(max(bisect.bisect_right(times, t), 1), len(run) - 1)
    (t0, e0), (t1, e1) = (times[i - 1], run[i - 1][key]), (times[i], run[i][key])
    return e0 if t1 == t0 else e0 + (e1 - e0) * (t - t0) / (t1 - t0)


def phase_energy(
    steps: Sequence[StepMarks], saves: Sequence[SaveMarks], node_windows: list[NodeReading], stage: StageEnergy
) -> list[PhaseEnergy]:
    """One row per phase, and "other" (start-up, evaluation, waiting): seconds, GPU and CPU joules, sources.

    `stage` is the segment's row from accounting.stage_energy: a part it measured (nvml, rapl) is integrated
    over the windows from the nodes' traces, a modelled part is split in proportion to the phase's seconds."""
    windows = phase_windows(steps, saves)
    traces = [read_trace(w.trace) for w in node_windows]
    stage = stage.to_json()
    counters = {"gpu": ("gpu_j", "nvml"), "cpu": ("rapl_j", "rapl")}
    rows = [{"phase": kind, "seconds": sum(end - start for start, end in spans)} for kind, spans in windows.items()]
    rows.append({"phase": "other", "seconds": max(stage["wall_s"] - sum(r["seconds"] for r in rows), 0.0)})
    for part, (key, measured) in counters.items():
        for row in rows[:-1]:
            row[f"{part}_j"] = (
                sum(counter_between(runs, key, *span) for runs in traces for span in windows[row["phase"]])
                if stage[f"{part}_source"] == measured
                else share(stage[f"{part}_j"], row["seconds"], stage["wall_s"])
            )
        inside = sum(r[f"{part}_j"] for r in rows[:-1])
        rows[-1][f"{part}_j"] = (
            max(stage[f"{part}_j"] - inside, 0.0)  # what the counters saw outside the phases
            if stage[f"{part}_source"] == measured
            else share(stage[f"{part}_j"], rows[-1]["seconds"], stage["wall_s"])
        )
    sources = {"gpu_source": phase_source(stage["gpu_source"]), "cpu_source": phase_source(stage["cpu_source"])}
    return [PhaseEnergy(**row, it_j=row["gpu_j"] + row["cpu_j"], **sources) for row in rows]


def share(joules: float, seconds: float, wall_s: float) -> float:
    return joules * seconds / wall_s if wall_s else 0.0


def phase_source(stage_source: str) -> str:
    """A measured source stays; a modelled one says it was split by time."""
    return stage_source if not stage_source.startswith("model") else f"{stage_source}, split by phase time"


def trace_host(path: str | Path) -> str:
    """The node a trace belongs to: its name is segment-<i>-<host>.jsonl (node.py)."""
    return Path(path).stem.split("-", 2)[-1]


def power_series(path: str | Path, cpu_watts_per_core: float) -> tuple[list[float], list[float], str]:
    """A node's power over time from its trace: seconds since the trace began, watts, and their source (the
    node's counters, else the stated model: its busy CPU cores x cpu_watts_per_core)."""
    runs = read_trace(path)
    first = runs[0][0] if runs else {}
    measured = [key for key in ("gpu_j", "rapl_j") if key in first]
    keys, scale = (measured, 1.0) if measured else (["cpu_busy_s"], cpu_watts_per_core)
    source = " + ".join(SOURCES[k] for k in measured) or f"model: busy cores x {cpu_watts_per_core:g} W"
    times, watts = [], []
    for run in runs if all(key in first for key in keys) else []:
        for a, b in zip(run, run[1:]):
            times.append(b["t"] - first["t"])
            watts.append(sum(b[k] - a[k] for k in keys) * scale / (b["t"] - a["t"]))
    return times, watts, source


SOURCES = {"gpu_j": "nvml", "rapl_j": "rapl"}


def mean_gpu_busy_pct(paths: list[str | Path]) -> float | None:
    """The GPUs' mean utilisation (NVML) over every sample of these node traces; None without NVML samples."""
    values = [pct for path in paths for run in read_trace(path) for s in run for pct in s.get("gpu_busy_pct", [])]
    return sum(values) / len(values) if values else None
