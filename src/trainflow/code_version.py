"""The code a segment ran: trainflow's release and, where it runs from a git checkout, the commit and whether the tree
had uncommitted changes; the Python and torch beside it. Recorded in every manifest and segment's lineage, so a
campaign that was upgraded under way says which steps which code trained.

    python -c "from trainflow.code_version import CodeVersion; print(CodeVersion.here())"
"""

from __future__ import annotations

import functools
import importlib.metadata
import platform
import subprocess
from dataclasses import dataclass
from pathlib import Path

from trainflow.records import Record

PACKAGE = Path(__file__).resolve().parent
"""src/trainflow: a git checkout's commit is read from here (never from a path a config names)."""


@dataclass(frozen=True)
class CodeVersion(Record):
    trainflow: str
    """The installed release (importlib.metadata)."""
    commit: str | None
    """The git commit of trainflow's checkout; None where it is installed from a wheel or git is missing."""
    dirty: bool | None
    """Uncommitted changes to tracked files in that checkout; None where commit is."""
    python: str
    torch: str | None

    @classmethod
    @functools.cache
    def here(cls) -> CodeVersion:
        commit, dirty = git_state()
        return cls(
            trainflow=release("trainflow"),
            commit=commit,
            dirty=dirty,
            python=platform.python_version(),
            torch=release("torch"),
        )

    def line(self) -> str:
        """trainflow 0.1.0 (3f2a9c0b1d2e+dirty), torch 2.13.0"""
        where = f" ({self.commit[:12]}{'+dirty' if self.dirty else ''})" if self.commit else ""
        return f"trainflow {self.trainflow}{where}, torch {self.torch}"

    def as_settings(self) -> dict[str, object]:
        """The code as settings (code.*): an upgrade between two segments is one of their changes."""
        return {"code.trainflow": self.trainflow, "code.commit": self.commit, "code.dirty": self.dirty}


def release(name: str) -> str | None:
    try:
        return importlib.metadata.version(name)
    except importlib.metadata.PackageNotFoundError:
        return None


def git_state() -> tuple[str | None, bool | None]:
    """The commit of the checkout trainflow runs from and whether tracked files changed; (None, None) outside one."""
    try:
        head = git("rev-parse", "HEAD")
        changed = git("status", "--porcelain", "--untracked-files=no")
    except (OSError, subprocess.SubprocessError):
        return None, None
    return (head, bool(changed)) if head else (None, None)


def git(*args: str) -> str:
    done = subprocess.run(["git", "-C", str(PACKAGE), *args], capture_output=True, text=True, timeout=10, check=True)
    return done.stdout.strip()
