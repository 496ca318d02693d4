"""What validate_nccl reads on every node beside its software stack (trainflow.stack): the seed's node settings
(transparent huge pages, swap, CUDA MPS), the GPUs' clock slowdowns and the checkpoint folder's Lustre stripe count.

    python -c "from trainflow.gate.nodes import node_facts; print(node_facts())"

Each reads the node it runs on; a fact that cannot be read here is None, with the reason where one is known.
"""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

from trainflow.energy.nvml import NodeGpus
from trainflow.gate.report import NodeFacts


def stripe_count(folder: str) -> tuple[int | None, str]:
    """The Lustre stripe count new files in `folder` get (`lfs getstripe -c`), or None and why it is not known."""
    if not shutil.which("lfs"):
        return None, "not applicable: no lfs command (not a Lustre file system)"
    out = subprocess.run(["lfs", "getstripe", "-c", "-d", folder], capture_output=True, text=True, timeout=30)
    if out.returncode or not out.stdout.strip().lstrip("-").isdigit():
        return None, f"not applicable: lfs getstripe says {(out.stderr or out.stdout).strip()[:200]!r}"
    return int(out.stdout.strip()), "lfs getstripe -c"


MPS_PROCESSES = ("nvidia-cuda-mps-control", "nvidia-cuda-mps-server")


def mps_running(proc: Path = Path("/proc")) -> bool:
    """Whether CUDA's MPS daemon runs on this node (it would share each GPU between processes)."""
    names = (p / "comm" for p in proc.iterdir() if p.name.isdigit())
    return any(name.read_text().strip() in MPS_PROCESSES for name in names if name.is_file())


def node_facts() -> NodeFacts:
    """The seed's node settings: transparent huge pages off, no swapping, no MPS daemon, no GPU clock slowdown;
    None where unreadable."""
    thp_path = Path("/sys/kernel/mm/transparent_hugepage/enabled")
    thp = re.search(r"\[(\w+)\]", thp_path.read_text())[1] if thp_path.exists() else None
    swap_used_kb = None
    meminfo = Path("/proc/meminfo")
    if meminfo.exists():
        fields = dict(line.split(":", 1) for line in meminfo.read_text().splitlines() if ":" in line)
        swap_used_kb = int(fields["SwapTotal"].split()[0]) - int(fields["SwapFree"].split()[0])
    slowdowns, gpu_why = gpu_slowdowns()
    return NodeFacts(
        thp=thp,
        swap_used_kb=swap_used_kb,
        mps_daemon=mps_running(),
        gpu_slowdowns=slowdowns,
        gpu_why=gpu_why,
    )


def gpu_slowdowns() -> tuple[list[int] | None, str]:
    """This node's GPUs' active hardware or thermal clock slowdowns (NVML), or None and why they cannot be read."""
    gpus, why = NodeGpus.open()
    if gpus is None:
        return None, why
    try:
        return gpus.slowdowns(), ""
    finally:
        gpus.close()
