"""Command-line values every entry point's argparse checks the same way (python -m trainflow.status, .export).

python -m trainflow.status runs/default --watch 0   # refused: --watch(0) must be a number of seconds > 0
"""

from __future__ import annotations

import argparse
import math
from collections.abc import Callable


def positive(flag: str, unit: str, example: str) -> Callable[[str], float]:
    """An argparse `type=` for a finite number above 0: the value, or argparse's one line naming the flag, what was
    typed and an example ("--max-shard-gb(nan) must be a number of GB > 0, such as 5")."""

    def parse(text: str) -> float:
        try:
            value = float(text)
        except ValueError:
            value = math.nan
        if not (math.isfinite(value) and value > 0):
            raise argparse.ArgumentTypeError(f"{flag}({text}) must be a number of {unit} > 0, such as {example}")
        return value

    return parse
