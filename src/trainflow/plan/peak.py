"""The peak memory a callable allocates on the CPU, from torch's profiler.

    python -c "import torch; from trainflow.plan.peak import peak_bytes; print(peak_bytes(lambda: torch.ones(2**20)))"

torch's CPU allocator bypasses Python's tracemalloc and has no counters of its own, but with
`profile_memory=True` the profiler records every allocation and free with the allocator's running
total ("Total Allocated" of the trace's `[memory]` events). That total counts only blocks allocated
while some profiler ran, and it carries over from one profiling session to the next, so the peak is
taken relative to the total just before the first event. Memory already held when the call begins
(weights, optimizer state) is not seen: add it yourself. A block allocated while no profiler ran and
freed inside the call is not subtracted (the profiler warns "Memory block of unknown size"), so the
figure is an upper bound then. Checked: torch.ones(25_000_000).sum() measures 100,000,012 bytes (the
tensor and the sum's scalar). The first profiled call of a process costs ~1.5 s more (kineto starts).
"""

from __future__ import annotations

import json
import tempfile
from collections.abc import Callable
from pathlib import Path

from torch.profiler import ProfilerActivity, profile


def peak_bytes(fn: Callable[[], object]) -> int:
    """The most CPU memory in use during fn(), above what was in use when it began (0: it only freed)."""
    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        fn()
    with tempfile.TemporaryDirectory() as tmp:
        trace = Path(tmp) / "trace.json"
        prof.export_chrome_trace(str(trace))
        events = json.loads(trace.read_text())["traceEvents"]
    memory = sorted((e["args"] for e in events if e.get("name") == "[memory]"), key=lambda a: a["Ev Idx"])
    if not memory:
        return 0
    start = memory[0]["Total Allocated"] - memory[0]["Bytes"]
    return max(start, *(a["Total Allocated"] for a in memory)) - start
