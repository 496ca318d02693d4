"""The peak memory a callable allocates on the CPU, from torch's profiler.

    python -c "import torch; from trainflow.plan.peak import peak_bytes; print(peak_bytes(lambda: torch.ones(2**20)))"

torch's CPU allocator bypasses Python's tracemalloc and has no counters of its own, but with
`profile_memory=True` the profiler records every allocation and free (address, bytes) made on the
threads it profiles; the bytes in use are summed from those records, from zero at the call's start.
Memory already held when the call begins (weights, optimizer state) is not seen: add it yourself. A
block allocated while no profiler ran and freed inside the call is not subtracted (the profiler warns
"Memory block of unknown size"), so the figure is an upper bound then. A block freed on a thread the
profiler does not see (gloo's threads free some of DDP's and FSDP's collective buffers) leaves no
record: it counts as freed when its address is allocated again, an upper bound too. The allocator's
own running total in the trace ("Total Allocated") is no help there: it keeps such a block forever and
subtracts its size a second time from whatever next takes its address (on 4 gloo ranks under FSDP2 it
came out 12-73 MB high, under DDP 99 MB low). Checked: torch.ones(25_000_000).sum() measures
100,000,012 bytes (the tensor and the sum's scalar). The first profiled call of a process costs ~1.5 s
more (kineto starts).
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
    live: dict[int, int] = {}
    """Bytes of each block allocated in the call and not yet seen freed, by address."""
    total = peak = 0
    for a in memory:
        address, nbytes = a["Addr"], a["Bytes"]
        if nbytes > 0:
            total += nbytes - live.get(address, 0)  # its address in use again: the old block was freed unseen
            live[address] = nbytes
            peak = max(peak, total)
        else:
            total -= live.pop(address, -nbytes)  # not in `live`: a block from before the call
    return peak
