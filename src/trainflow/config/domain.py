"""A config field's domain, declared beside its default: `checked(default, ge=1)`, `checked(one_of=...)`.

    python -c "from trainflow.config.domain import Domain; print(Domain(ge=1).violation(0))"

config.validate checks every field that has one (domain_errors walks the schema), so a value out of its domain
fails when a config is composed, in one line naming the key, the value and the rule.
"""

from __future__ import annotations

import math
import operator
import re
from dataclasses import dataclass, field
from typing import Any

from omegaconf import MISSING


@dataclass(frozen=True)
class Domain:
    """The values a config field may take; config.checks checks every field that has one."""

    gt: float | None = None
    ge: float | None = None
    lt: float | None = None
    le: float | None = None
    one_of: tuple[str, ...] = ()
    pattern: str = ""
    """A regular expression the whole string (or each list item) must match."""
    fix: str = ""
    """What to do instead, appended to the error."""

    def violation(self, value: Any) -> str | None:
        """Why `value` lies outside the domain (None: it does not, or it is an optional field left unset)."""
        if value is None:
            return None
        bounds = (
            (self.gt, ">", operator.gt),
            (self.ge, ">=", operator.ge),
            (self.lt, "<", operator.lt),
            (self.le, "<=", operator.le),
        )
        fix = f" ({self.fix})" if self.fix else ""
        if any(b is not None for b, _, _ in bounds) and not math.isfinite(value):
            return "must be a finite number"
        for bound, sign, holds in bounds:
            if bound is not None and not holds(value, bound):
                return f"must be {sign} {bound:g}{fix}"
        if self.one_of and value not in self.one_of:
            return "must be one of " + ", ".join(self.one_of) + fix
        if self.pattern and not re.fullmatch(self.pattern, value):
            return f"must match {self.pattern}{fix}"
        return None


def checked(default: Any = MISSING, *, factory: Any = None, **domain: Any) -> Any:
    """A dataclass field with its domain beside its default (see Domain)."""
    metadata = {"domain": Domain(**{k: tuple(v) if k == "one_of" else v for k, v in domain.items()})}
    if factory is not None:
        return field(default_factory=factory, metadata=metadata)
    return field(default=default, metadata=metadata)


# Strings that reach a command line or an sbatch script: no whitespace, quotes or shell syntax.
SLURM_WORD = r"[\w.,:@%+=&|!*()\[\]-]*"
RUN_NAME = r"[A-Za-z0-9_][A-Za-z0-9_.-]*"
PHASE_NAME = r"[a-z][a-z0-9_]{0,31}"
"""A phase's name (config.phases): part of its checkpoint series' folder name."""
SERIES = rf"[0-9a-f]{{12}}(?:-(?:b[0-9]+|{PHASE_NAME}-[0-9a-f]{{8}}))*"
"""A checkpoint series' name (config.identity): the main series' key, then a branch's -b<step> or a later phase's
-<phase>-<digest>."""
# A container image, an EDF or a program inside a container as srun's line takes them (trainflow.launch.container):
# letters, digits and ._/+@- only; no spaces, quotes, `$` or `~` (expand variables before giving one). A bind mount
# adds Apptainer's src[:dst[:ro|rw]].
CONTAINER_FILE = r"[\w./+@-]*"
BIND_MOUNT = r"[\w./+@-]+(:[\w./+@-]+(:(ro|rw))?)?"
