"""Does the plan fit in device memory: the capacity a rank has, and the one line that stops the DAG when not.

    python -c "from trainflow.config import compose; from trainflow.plan.core import plan_core; \
        print(plan_core(compose('train_segment', ['experiment=llama70b_alps'])).overflow)"

On a GPU the capacity is cluster.hardware.device_memory_gb; on a CPU device, where it is the node's host memory (the
CPU presets set it to cluster.allocation.mem_gb), a rank's share of it: device_memory_gb / ranks per node. The estimate
is trainflow.plan.memory's (the worst pipeline rank's peak); the line names its largest term and the fix
for that term.
"""

from __future__ import annotations

from trainflow.config.schema import ClusterConfig, TrainflowConfig
from trainflow.plan.memory import MemoryEstimate

GB = 1e9


def capacity_bytes(cluster: ClusterConfig, ranks_per_node: int) -> float:
    """Bytes one rank may hold (module docstring)."""
    if cluster.runtime.device == "cpu":
        return cluster.hardware.device_memory_gb * GB / ranks_per_node
    return cluster.hardware.device_memory_gb * GB


def overflow(cfg: TrainflowConfig, memory: MemoryEstimate, capacity: float) -> str | None:
    """One line naming the term that overflows `capacity` (capacity_bytes) and its fix; None when the plan fits."""
    if memory.total <= capacity:
        return None
    terms = {
        "activations": memory.activations,
        "parameters + gradients + optimizer state": memory.parameters + memory.gradients + memory.optimizer_state,
        "bf16 weight copies": memory.weight_copies,
        "FSDP's gathered parameters": memory.gathered,
    }
    name, size = max(terms.items(), key=lambda kv: kv[1])
    where = "cluster.hardware.device_memory_gb" + (
        "" if cfg.cluster.runtime.device == "cuda" else " shared by a node's ranks"
    )
    return (
        f"the plan does not fit: pipeline rank {memory.pp_rank} needs {memory.total / GB:.3g} GB of "
        f"{capacity / GB:.3g} GB ({where}); {name} take {size / GB:.3g} GB: {_fix(name, cfg)}"
    )


def _fix(term: str, cfg: TrainflowConfig) -> str:
    p, t = cfg.parallel, cfg.train
    more = f"or raise parallel.tp({p.tp}) / parallel.pp({p.pp})"
    if term == "activations":
        if t.activations == "keep":
            return f"set train.activations=recompute (each block keeps only its input), {more}"
        return (
            f"raise parallel.cp({p.cp}) (each rank holds 1/cp of every sequence) or parallel.microbatches"
            f"({p.microbatches}) (fewer tokens each), {more}"
        )
    if term == "parameters + gradients + optimizer state" and p.dp_mode == "replicate" and p.dp > 1:
        return f"set parallel.dp_mode=shard (1/{p.dp} of them per rank), {more}"
    if term == "bf16 weight copies" and p.dp > 1:
        return f"set parallel.dp_mode=shard (no autocast copies), {more}"
    return f"raise parallel.tp({p.tp}) / parallel.pp({p.pp}) or use more ranks"
