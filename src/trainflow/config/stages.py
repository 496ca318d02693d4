"""The stage table: every stage of the DAG, the config it reads (its rule's hash) and whether it submits its own
allocation of the training shape. STAGES, STAGE_READS (config.hashing), the stages whose work runs on the
allocation (energy accounting) and the Snakefile's localrules derive from it; tests/unit/test_stage_table.py holds
the Snakefile, workflow/rules/, conf/ and trainflow.stages against it.

    python -c "from trainflow.config.stages import STAGE_TABLE; [print(s) for s in STAGE_TABLE]"

A stage's name is its rule (workflow/rules/<name>.smk), its module (trainflow.stages.<name>), its primary Hydra
config (conf/<name>.yaml), its log folder (logs/<name>/) and its metrics file (metrics/<name>.json).
"""

from __future__ import annotations

from dataclasses import dataclass

SERIES = "series"
"""What a training segment's and the verification's outputs are: the checkpoint series (config.identity), never the
settings that compute it. A changed setting reruns no completed segment; it applies from the first one not yet
completed (which trainflow.campaign records in its lineage), and an identity change is refused inside a run."""
UNHASHED = ("cluster.allocation.container", "cluster.allocation.spare_nodes")
"""Which container the ranks run in and how many spare nodes a job holds for hot restarts (launch.supervisor), never
what is computed: in no hash, like the resilience and fault sections (which no stage's hash reads), so moving the
campaign into an image, or giving its jobs spares, reruns nothing; the report names a campaign whose segments ran on
different stacks."""


@dataclass(frozen=True)
class Stage:
    name: str
    reads: tuple[str, ...]
    """The config subtrees whose hash is the rule's params: a change in them reruns the stage and what follows
    (`series`: the checkpoint series' name, config.hashing.section)."""
    allocates: bool = False
    """Submits its own allocation of the training shape through submitit and waits (a Snakemake localrule); its
    work runs on that allocation's nodes."""


STAGE_TABLE = (
    Stage("prepare_data", ("tokens",)),  # data without the sources' weights (config.hashing.section)
    Stage("stage_data", ("tokens",)),
    Stage("build_kernels", ("train",)),  # which fp8 kernels the ranks dispatch: train.fp8
    # and the plan, which reads model, train, checkpoint and energy too
    Stage("validate_nccl", ("parallel", "cluster", "model", "train", "checkpoint", "energy"), allocates=True),
    Stage("train_segment", (SERIES,), allocates=True),
    Stage("verify_checkpoint", (SERIES,)),  # the checkpoint series it verifies
    Stage("evaluate", (SERIES, "evaluate")),  # one checkpoint of the series, scored on the tasks
    Stage("account_energy", ("energy", "cluster")),
    Stage("report", ("model", "parallel", "train", "cluster", "energy", "observe")),
)

STAGES = tuple(s.name for s in STAGE_TABLE)
STAGE_READS = {s.name: s.reads for s in STAGE_TABLE}
ALLOCATING = tuple(s.name for s in STAGE_TABLE if s.allocates)
"""Stages whose work runs on the training allocation (validate_nccl, train_segment): localrules in the Snakefile."""
