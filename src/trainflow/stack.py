"""The software stack a rank runs on, read inside its own environment (a container's, a uenv's or the venv's): the
image or uenv, then torch, CUDA, NCCL, libfabric and aws-ofi-nccl (config.cluster's VERSION_COMPONENTS).

    python -c "from trainflow.stack import versions; print(versions())"

validate_nccl records it for every rank and gates it (cluster.gate.versions_allowed; every node the same), each
training job records it again for its nodes (the segment's summary), and the report lists both and says in one line
when they were not all one stack: the seed lost 30 % to an NCCL / libfabric mismatch on Alps, and a campaign whose
segments ran in different images is that trap spread over time.

Where a value comes from: the image from TRAINFLOW_IMAGE, which trainflow's containers set to their base's name@digest
(containers/trainflow.def's %environment, profiles/slurm/alps.toml's [env]), else Apptainer's own APPTAINER_CONTAINER
(the .sif's path); a uenv from UENV_MOUNT_LIST (uenv's list of mounted images; not checked on Alps here); torch, CUDA
and NCCL from torch; libfabric from `fi_info --version`; aws-ofi-nccl from AWS_OFI_NCCL_VERSION where the image sets it.
None: not there, or not readable on this node.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from trainflow.records import Record

IMAGE_VARS = ("TRAINFLOW_IMAGE", "APPTAINER_CONTAINER", "SINGULARITY_CONTAINER")
UENV_VAR = "UENV_MOUNT_LIST"


@dataclass(frozen=True)
class NodeStack(Record):
    """One node's stack as its ranks saw it (every rank of a node reads the same, so one per node and stack)."""

    host: str
    versions: dict[str, str | None]
    """image, uenv, torch, cuda, nccl, libfabric, aws_ofi_nccl (config.cluster.VERSION_COMPONENTS)."""


def libfabric_version() -> str | None:
    """libfabric's version from `fi_info --version`, if installed."""
    if not shutil.which("fi_info"):
        return None
    out = subprocess.run(["fi_info", "--version"], capture_output=True, text=True, timeout=10).stdout
    m = re.search(r"libfabric:\s*(\S+)", out)
    return m[1] if m else out.strip() or None


def versions(env: Mapping[str, str] = os.environ) -> dict[str, str | None]:
    """This process's stack (module docstring)."""
    import torch

    nccl = ".".join(map(str, torch.cuda.nccl.version())) if torch.cuda.is_available() else None
    return {
        "image": next((env[k] for k in IMAGE_VARS if env.get(k)), None),
        "uenv": env.get(UENV_VAR) or None,
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "nccl": nccl,
        "libfabric": libfabric_version(),
        "aws_ofi_nccl": env.get("AWS_OFI_NCCL_VERSION"),
    }


def per_node(stacks: Iterable[NodeStack]) -> list[NodeStack]:
    """One entry per node and stack, by host (a node whose ranks saw two stacks keeps both)."""
    seen = {(s.host, tuple(sorted(s.versions.items(), key=str))): s for s in stacks}
    return [seen[k] for k in sorted(seen, key=str)]


def describe(versions: Mapping[str, str | None]) -> str:
    """A stack in one phrase: 'image X, torch 2.13.0+cpu, CUDA -, NCCL -, ...' (- where there is none)."""
    names = {"cuda": "CUDA", "nccl": "NCCL", "aws_ofi_nccl": "aws-ofi-nccl"}
    where = versions.get("image") or (f"uenv {versions['uenv']}" if versions.get("uenv") else "no container")
    rest = [f"{names.get(k, k)} {v or '-'}" for k, v in versions.items() if k not in ("image", "uenv")]
    return ", ".join([where, *rest])


def mixed_stack(runs: Mapping[str, Iterable[NodeStack]]) -> str | None:
    """The one line for a campaign whose runs (the gate, each segment: name -> its nodes' stacks) did not all run one
    stack, naming each stack and who ran it; None when they did."""
    users: dict[str, list[str]] = {}
    for name, stacks in runs.items():
        for stack in {describe(s.versions) for s in stacks}:
            users.setdefault(stack, []).append(name)
    if len(users) < 2:
        return None
    parts = "; ".join(f"{', '.join(names)} on {stack}" for stack, names in sorted(users.items()))
    return (
        f"Mixed software stack: {parts}. The seed lost 30 % to an NCCL / libfabric mismatch on Alps: run every job in "
        "one image (cluster.allocation.container) and pin it in cluster.gate.versions_allowed"
    )
