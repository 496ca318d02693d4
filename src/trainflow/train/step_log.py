"""The records of training steps and evaluations, kept beside the checkpoints they belong to, so a resumed or rerun
segment reports its whole range.

    python -c "from trainflow.journal import Journal; from trainflow.train.step_log import StepRecord; \
        print(Journal('runs/default/capacity/checkpoints/<series>/steps.jsonl', StepRecord).read()[:1])"

One JSON line per training step, evaluation and loss-guard event, appended by rank 0. On resume from step s, the
records of the steps this segment will redo are dropped first: they belong to work the checkpoint does not contain.
Records of other segments stay. The time spans (spans.jsonl, resilience.goodput.Span) are never dropped: they are
what the redone work cost.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from trainflow.records import Record, fields_added


@dataclass(frozen=True)
class StepRecord(Record):
    """One training step on rank 0: the step it started from, its loss and the split of its seconds."""

    FORMAT = 2
    MIGRATIONS = {1: fields_added}  # window, sources

    step: int
    started: float
    """Wall-clock time (time.time()) the step began: energy's phase windows."""
    loss: float
    lr: float
    grad_norm: float
    step_s: float
    tokens_per_s: float
    """All devices together."""
    mfu: float
    memory_mb: float
    """Rank 0's memory after the step: the allocator's on a GPU, the resident set on a CPU."""
    data_s: float
    compute_s: float
    dp_comm_s: float
    """Exposed data-parallel communication (after backward)."""
    bubble_s: float
    activation_s: float
    forward_s: float = 0.0
    """This rank's own forward seconds (train.clock: the straggler measure)."""
    skipped: str | None = None
    """Why the loss-spike guard did not apply the step (train.guard); None: applied."""
    window: list[int] = field(default_factory=list)
    """Its data window: [start, end) of the training stream's global sample positions (data.stream); [] before
    format 2."""
    sources: list[int] = field(default_factory=list)
    """Its rows from each source, in the token index's order (data.mixture: the realised mixture)."""


@dataclass(frozen=True)
class EvalRecord(Record):
    step: int
    """The step the evaluation ended at (0: before training)."""
    val_loss: float
    """The sources' validation losses weighted as data.sources weighs them (the one source's, without a mixture)."""
    sources: dict[str, float] = field(default_factory=dict)
    """Each source's validation loss, by name (data.sources; `corpus` for a plain data.corpus)."""
