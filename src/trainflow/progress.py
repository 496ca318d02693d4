"""Periodic progress lines with rate and ETA, for logs that a person tails (no terminal bar)."""

from __future__ import annotations

import logging
import time


class Progress:
    """Logs `verb done/total unit (pct), rate, ETA` at most every `every_s` seconds and at the end."""

    def __init__(self, log: logging.Logger, verb: str, total: int, *, unit: str, every_s: float = 5.0) -> None:
        self.log, self.verb, self.total, self.unit, self.every_s = log, verb, total, unit, every_s
        self.start = self.last = time.perf_counter()

    def update(self, done: int, note: str = "") -> None:
        now = time.perf_counter()
        if now - self.last < self.every_s and done < self.total:
            return
        self.last = now
        rate = done / max(now - self.start, 1e-9)
        eta = (self.total - done) / rate if rate > 0 else float("inf")
        self.log.info(
            "%s %d/%d %s (%.0f%%), %.1f %s/s, ETA %.0f s%s",
            self.verb,
            done,
            self.total,
            self.unit,
            100 * done / max(self.total, 1),
            rate,
            self.unit,
            eta,
            f", {note}" if note else "",
        )
