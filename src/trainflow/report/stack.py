"""The report's software-stack section: the image or uenv and the versions every node ran, as validate_nccl and each
training job read them inside the ranks' environment (trainflow.stack), and one line on whether they were one stack.

    lines = stack_section(nccl, segments)   # stages.report does
"""

from __future__ import annotations

from collections.abc import Sequence

from trainflow.config.cluster import VERSION_COMPONENTS
from trainflow.gate.report import NcclReport
from trainflow.report.sections import table
from trainflow.stack import NodeStack, describe, mixed_stack, per_node
from trainflow.train.summary import SegmentSummary


def stack_section(nccl: NcclReport, segments: Sequence[SegmentSummary]) -> list[str]:
    runs = {"validate_nccl": per_node(NodeStack(h.host, h.versions) for h in nccl.hosts)}
    runs |= {f"segment {s.segment}": s.stack for s in segments if s.stack}
    rows = []
    for name, stacks in runs.items():
        by_stack: dict[tuple, list[str]] = {}
        for s in stacks:
            key = tuple(s.versions.get(k) for k in VERSION_COMPONENTS)
            by_stack.setdefault(key, []).append(s.host)
        rows += [[name, ", ".join(sorted(set(hosts))), *(v or "-" for v in key)] for key, hosts in by_stack.items()]
    unrecorded = [str(s.segment) for s in segments if not s.stack]
    mixed = mixed_stack(runs)
    one = next(iter(runs["validate_nccl"]), None)
    verdict = mixed or (
        f"One software stack for the gate and every recorded segment: {describe(one.versions)}."
        if one
        else "The gate recorded no stack."
    )
    return [
        "## Software stack",
        "",
        "What each node's ranks ran on, read inside their environment (the container's, the uenv's or the venv's; "
        "trainflow.stack); cluster.gate.versions_allowed pins any of it.",
        "",
        table(rows, ["run", "hosts", *VERSION_COMPONENTS]),
        "",
        verdict + (f" Segments {', '.join(unrecorded)} recorded none (an older trainflow)." if unrecorded else ""),
        "",
    ]
