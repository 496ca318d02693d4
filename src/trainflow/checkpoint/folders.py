"""How a checkpoint series lies on disk, without torch (verify_checkpoint and the launcher only list it).

python -c "from trainflow.checkpoint.folders import list_steps; print(list_steps('runs/default/capacity/checkpoints'))"

<root>/step-00000150/        a complete checkpoint (renamed into place after its manifest)
<root>/step-00000150.tmp/    a save in progress or crashed (removed by the next save)
<root>/step-00000150.pruned/ a prune in progress or crashed (removed by the next prune)
"""

from __future__ import annotations

import re
from pathlib import Path

STEP = re.compile(r"step-(\d+)")


def step_dir(root: str | Path, step: int, state: str = "") -> Path:
    """The folder of checkpoint `step`; `state` "tmp" or "pruned" names it while saved or deleted."""
    return Path(root) / (f"step-{step:08d}" + (f".{state}" if state else ""))


def list_steps(root: str | Path) -> list[int]:
    """Completed checkpoints (renamed into place; not `.tmp` or `.pruned`), oldest first."""
    root = Path(root)
    if not root.is_dir():
        return []
    return sorted(int(m[1]) for p in root.glob("step-*") if p.is_dir() and (m := STEP.fullmatch(p.name)))
