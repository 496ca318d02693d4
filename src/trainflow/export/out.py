"""Where an export may write: OUT, a new or empty folder outside the checkpoint series it exports.

    python -c "from pathlib import Path; from trainflow.export.out import check_out as c; c(Path('hf/x'), Path('runs'))"

Everything is written into a temporary folder beside OUT and renamed into place (hf.write), so OUT is new or empty.
"""

from __future__ import annotations

import os
from pathlib import Path

from trainflow.config.security import unsafe_path
from trainflow.export.source import ExportError


def check_out(out: Path, series: Path) -> None:
    """OUT is a path trainflow writes (the rules of config.security.path_errors), new or empty, and outside
    the checkpoint series (a file there would make its checkpoints incomplete)."""
    if why := unsafe_path("OUT", str(out)):
        raise ExportError(why)
    if os.path.lexists(out) and not out.is_dir():
        raise ExportError(f"OUT({out}) is a file (or a link to none); give a new or empty folder")
    if out.is_dir() and any(out.iterdir()):
        raise ExportError(f"OUT({out}) already holds files; give a new or empty folder (export overwrites nothing)")
    try:
        resolved, inside = out.resolve(), series.resolve()
    except (RuntimeError, OSError) as err:  # RuntimeError: pathlib's word for a symlink loop on the way
        raise ExportError(
            f"OUT({out}) or {series} does not resolve ({err}); give a folder without a link loop"
        ) from None
    if resolved == inside or inside in resolved.parents:
        raise ExportError(
            f"OUT({out}) lies inside the checkpoint series {series}, whose checkpoints would then hold unlisted "
            "files; export elsewhere"
        )
