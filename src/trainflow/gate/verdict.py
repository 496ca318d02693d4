"""The gate's verdict on what validate_nccl measured: every reason to stop before training, one line each naming
the value, the threshold that refused it and the fix.

    python -c "from trainflow.gate.verdict import version_problems; print(version_problems([], {}))"
"""

from __future__ import annotations

from trainflow.config.cluster import GateConfig
from trainflow.gate.report import HostFacts, PatternRow, SweepRow
from trainflow.stack import describe


def problems(
    sweep: list[SweepRow], patterns: list[PatternRow], hosts: list[HostFacts], stripes: int | None, gate: GateConfig
) -> list[str]:
    """Reasons to stop before training (empty: go)."""
    found = []
    if sweep and (best := sweep[-1]).busbw_gbps < gate.min_busbw_gbps:
        found.append(
            f"all_reduce busbw {best.busbw_gbps:.3f} GB/s at {best.bytes} bytes is below "
            f"cluster.gate.min_busbw_gbps({gate.min_busbw_gbps}); check the network (NCCL_DEBUG=INFO) or lower the gate"
        )
    for row in patterns:
        if row.passed is False:
            found.append(
                f"{row.pattern} busbw {row.busbw_gbps:.3f} GB/s on the slowest of its {row.groups} groups "
                f"(ranks {row.slowest_group}, hosts {','.join(row.slowest_hosts)}) is below "
                f"cluster.gate.busbw_gbps.{row.pattern}({row.threshold_gbps})"
            )
    stacks: dict[str, set[str]] = {}
    for h in hosts:
        stacks.setdefault(describe(h.versions), set()).add(h.host)
    if len(stacks) > 1:  # the image, torch, CUDA, NCCL, libfabric or aws-ofi-nccl: any of them
        listed = "; ".join(f"{','.join(sorted(names))}: {stack}" for stack, names in sorted(stacks.items()))
        found.append(
            f"the software stack's versions differ across nodes ({listed}): run every node in one image or uenv "
            "(cluster.allocation.container; seed: -30 % on Alps from an NCCL / libfabric mismatch)"
        )
    found += version_problems(hosts, gate.versions_allowed)
    if stripes is not None and 0 < stripes < gate.min_stripe_count:  # -1: striped over every target
        found.append(
            f"the checkpoint folder's Lustre stripe count {stripes} is below cluster.gate.min_stripe_count("
            f"{gate.min_stripe_count}): lfs setstripe -c {gate.min_stripe_count} <folder> before training"
        )
    return found


def version_problems(hosts: list[HostFacts], allowed: dict[str, list[str]]) -> list[str]:
    """Nodes whose stack is not in the compatibility table (cluster.gate.versions_allowed), one line per component."""
    found = []
    for component, prefixes in allowed.items():
        bad = sorted(
            {(h.host, str(h.versions.get(component))) for h in hosts}
            - {(h.host, v) for h in hosts if (v := h.versions.get(component)) and v.startswith(tuple(prefixes))}
        )
        if bad:
            listed = ", ".join(f"{host}: {version}" for host, version in bad)
            found.append(
                f"{component} {listed} is not in cluster.gate.versions_allowed.{component} ({' | '.join(prefixes)}*); "
                "load the validated stack on those nodes or extend the table after validating it"
            )
    return found
