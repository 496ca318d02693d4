"""What a rank's steps cost inside: a torch.profiler trace of a few steps and its top operators, and the
memory a rank holds after each step (the report's leak check).

    profiler = StepProfiler(folder, rank=0, steps=3, device=device)  # folder None: off
    ... after each training step: profiler.step() ... ; summary = profiler.close()

The trace skips one step and warms up on the next (torch.profiler's schedule: wait 1, warmup 1, active
`steps`), then writes `rank<r>.json` (Chrome trace format: chrome://tracing or ui.perfetto.dev) and
`rank<r>-top.json`, the operators that took the most self time (on the GPU when there is one).
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import torch
from torch.profiler import ProfilerActivity, profile, schedule

from trainflow.atomic import write_text_atomic
from trainflow.train.summary import Operator, ProfileSummary

TOP = 15


class StepProfiler:
    def __init__(self, folder: Path | None, *, rank: int, steps: int, device: torch.device) -> None:
        self.rank, self.summary = rank, None
        self.on_gpu = device.type == "cuda"
        if folder is None:
            self.prof = None
            return
        activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if self.on_gpu else [])
        self.prof = profile(
            activities=activities,
            schedule=schedule(wait=1, warmup=1, active=steps, repeat=1),
            on_trace_ready=lambda prof: self.write(prof, folder),
            record_shapes=False,
        )
        self.prof.start()

    def step(self) -> None:
        if self.prof is not None:
            self.prof.step()

    def close(self) -> ProfileSummary | None:
        """Stop (writing the trace if the segment ended inside the active steps); the trace's summary."""
        if self.prof is not None:
            self.prof.stop()
            self.prof = None
        return self.summary

    def write(self, prof: profile, folder: Path) -> None:
        folder.mkdir(parents=True, exist_ok=True)
        trace = folder / f"rank{self.rank}.json"
        prof.export_chrome_trace(str(trace))
        device = "device" if self.on_gpu else "cpu"
        ops = sorted(prof.key_averages(), key=lambda e: getattr(e, f"self_{device}_time_total"), reverse=True)
        total = sum(getattr(e, f"self_{device}_time_total") for e in ops) or 1.0
        top = [
            Operator(
                e.key,
                getattr(e, f"self_{device}_time_total") / 1e3,
                getattr(e, f"self_{device}_time_total") / total,
                e.count,
            )
            for e in ops[:TOP]
        ]
        self.summary = ProfileSummary(trace=str(trace), clock=device, top=top)
        write_text_atomic(folder / f"rank{self.rank}-top.json", json.dumps(self.summary.to_json(), indent=1))


def memory_mb(device: torch.device) -> float:
    """The memory this rank holds now: the caching allocator's allocated bytes on a GPU, the resident set on CPU."""
    if device.type == "cuda":
        return torch.cuda.memory_allocated(device) / 2**20
    return int(Path("/proc/self/statm").read_text().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20
