"""The cross-field rules of a composed config, pure functions of its values (the layout's are config.layout's):
each broken rule is one message naming every value it involves and the fix.

    python -c "from trainflow.config import compose; compose('train_segment', ['train.fp8=delayed'])"
"""

from __future__ import annotations

from trainflow.config.cluster import GATE_PATTERNS, GOODPUT_INPUTS, VERSION_COMPONENTS, ClusterConfig, GateConfig
from trainflow.config.energy import EnergyConfig
from trainflow.config.evaluate import evaluate_errors
from trainflow.config.faults import fault_errors
from trainflow.config.observe import observe_errors
from trainflow.config.resilience import resilience_errors
from trainflow.config.schema import BYTE_VOCAB, SPIKE_WINDOW, LrSchedule, ModelConfig, OptimConfig, TrainflowConfig
from trainflow.config.shape import linear_shapes
from trainflow.config.sources import source_errors
from trainflow.config.startup import StartupPart

FP8_TILE = 16  # fp8 tensor-core GEMMs (cuBLASLt's, and full tiles of kernels/) take features in multiples of 16


def rule_errors(cfg: TrainflowConfig) -> list[str]:
    """Every rule below (the layout's are checked beside them, by config.layout.parallel_errors)."""
    d, m = cfg.data, cfg.model
    errors = model_errors(m) + train_errors(cfg) + energy_errors(cfg.energy) + allocation_errors(cfg) + source_errors(d)
    o, timeout_s, hang_s = cfg.observe, cfg.cluster.runtime.collective_timeout_s, cfg.resilience.hang_detect_s
    errors += observe_errors(o.wandb, o.mlflow, collective_timeout_s=timeout_s, hang_detect_s=hang_s)
    errors += resilience_errors(cfg.resilience) + fault_errors(cfg.fault) + optim_errors(cfg.optim)
    errors += evaluate_errors(cfg.evaluate) + recovery_errors(cfg)
    if d.tokenizer == "byte" and d.vocab_size != BYTE_VOCAB:
        errors.append(f"data.vocab_size({d.vocab_size}) must be {BYTE_VOCAB} with the byte tokenizer")
    if m.vocab_size < d.vocab_size:
        errors.append(
            f"model.vocab_size({m.vocab_size}) < data.vocab_size({d.vocab_size}): the tokenizer's ids "
            "would overflow the embedding; use a model with at least data.vocab_size rows"
        )
    if cfg.fault.rank >= cfg.parallel.world_size:
        errors.append(f"fault.rank({cfg.fault.rank}) must be < the world size {cfg.parallel.world_size}")
    return errors


def allocation_errors(cfg: TrainflowConfig) -> list[str]:
    """The layout's ranks fill whole nodes, one per GPU where there are GPUs."""
    p, a = cfg.parallel, cfg.cluster.allocation
    if p.world_size % a.nodes:
        cp = f" * cp({p.cp})" if p.cp > 1 else ""
        return [
            f"world size dp({p.dp}){cp} * tp({p.tp}) * pp({p.pp}) = {p.world_size} is not divisible by "
            f"cluster.allocation.nodes({a.nodes}); change the layout or the node count"
        ]
    if a.gpus_per_node and p.world_size // a.nodes != a.gpus_per_node:
        return [
            f"world size {p.world_size} / cluster.allocation.nodes({a.nodes}) = {p.world_size // a.nodes} tasks per "
            f"node != cluster.allocation.gpus_per_node({a.gpus_per_node}); one task drives one GPU"
        ]
    return []


def recovery_errors(cfg: TrainflowConfig) -> list[str]:
    """Recovery from peers needs a spare node for the failed one's ranks and a live replica of every shard."""
    p, spares, snapshots = cfg.parallel, cfg.cluster.allocation.spare_nodes, cfg.checkpoint.snapshot_steps
    if cfg.resilience.recovery != "peers":
        if snapshots:
            return [
                f"checkpoint.snapshot_steps({snapshots}) keeps snapshots for a recovery from peers, and "
                f"resilience.recovery is {cfg.resilience.recovery}; set resilience.recovery=peers or "
                "checkpoint.snapshot_steps=0"
            ]
        return []
    errors = []
    if snapshots and cfg.cluster.allocation.nodes < 2:
        errors.append(
            f"checkpoint.snapshot_steps({snapshots}) sends each rank's snapshot to another node, and "
            f"cluster.allocation.nodes is {cfg.cluster.allocation.nodes}; use 2 or more nodes or snapshot_steps=0"
        )
    if not spares:
        errors.append(
            "resilience.recovery=peers starts the failed node's ranks on a spare, and cluster.allocation.spare_nodes "
            "is 0; set it to 1 or more, or resilience.recovery=job"
        )
    shard = p.dp if p.dp_mode == "shard" and p.dp_shard in (0, p.dp) else (p.dp_shard if p.dp_mode == "shard" else 1)
    if p.dp // shard < 2 and not snapshots:
        errors.append(
            f"resilience.recovery=peers takes a failed rank's state from a data-parallel replica, and layout {p.name} "
            f"holds {p.dp // shard} copy of each shard (dp({p.dp}), dp_mode={p.dp_mode}, dp_shard={p.dp_shard}); "
            "use a layout with dp >= 2 replicas (dp_mode=replicate, or HSDP), keep peer snapshots "
            "(checkpoint.snapshot_steps > 0), or resilience.recovery=job"
        )
    return errors


def table_errors(cluster: ClusterConfig) -> list[str]:
    """validate_nccl's tables name known patterns and components, with sane values (checked with the domains:
    a dict's entries have none of their own)."""
    g: GateConfig = cluster.gate
    errors = [
        f"cluster.gate.busbw_gbps has {name!r}, no pattern: use {', '.join(GATE_PATTERNS)}"
        for name in g.busbw_gbps
        if name not in GATE_PATTERNS
    ]
    errors += [
        f"cluster.gate.busbw_gbps.{name}({gbps}) must be a number >= 0"
        for name, gbps in g.busbw_gbps.items()
        if not (isinstance(gbps, int | float) and gbps >= 0)
    ]
    labelled = [*GOODPUT_INPUTS, *StartupPart]
    errors += [
        f"cluster.measured has {name!r}, no input of the goodput plan nor part of the start-up: use "
        f"{', '.join(labelled)}"
        for name in cluster.measured
        if name not in labelled
    ]
    h = cluster.hardware
    errors += [
        f"cluster.hardware.{name} is unset and cluster.hardware.startup gives no start-up model to sum: set "
        f"{name}, or the parts' laws (config.startup)"
        for name, value in (("startup_s", h.startup_s), ("hot_restart_s", h.hot_restart_s))
        if value is None and h.startup is None
    ]
    errors += [
        f"cluster.measured.{name} must say where it was measured in one line of printable text (at most 200 "
        "characters), such as 'run alps-70b, 2026-11-02, 4096 ranks'"
        for name, where in cluster.measured.items()
        if not (isinstance(where, str) and 0 < len(where) <= 200 and where.isprintable())
    ]
    errors += [
        f"cluster.gate.versions_allowed has {name!r}, which validate_nccl does not read: use "
        f"{', '.join(VERSION_COMPONENTS)}"
        for name in g.versions_allowed
        if name not in VERSION_COMPONENTS
    ]
    return errors


def energy_errors(e: EnergyConfig) -> list[str]:
    if e.idle_clock_mhz > e.compute_clock_mhz:
        return [
            f"energy.idle_clock_mhz({e.idle_clock_mhz}) > energy.compute_clock_mhz({e.compute_clock_mhz}): DVFS lowers "
            f"clocks while data loads; choose an idle clock in 1-{e.compute_clock_mhz} MHz"
        ]
    return []


def optim_errors(o: OptimConfig) -> list[str]:
    """A decay of its own length is wsd's: cosine's spans the whole run."""
    if o.decay_steps and o.schedule == LrSchedule.COSINE:
        return [
            f"optim.decay_steps({o.decay_steps}) is set but optim.schedule is cosine, whose decay spans the whole run; "
            "set optim.schedule=wsd for a decay over the last decay_steps steps, or optim.decay_steps=0"
        ]
    return []


def model_errors(m: ModelConfig) -> list[str]:
    errors = []
    if m.dim % m.n_heads:
        errors.append(f"model.dim({m.dim}) is not divisible by model.n_heads({m.n_heads})")
    elif m.head_dim % 2:
        errors.append(
            f"model.dim({m.dim}) / n_heads({m.n_heads}) = {m.head_dim} is odd; rotary embeddings need an even head dim"
        )
    if m.n_heads % m.n_kv_heads:
        errors.append(
            f"model.n_kv_heads({m.n_kv_heads}) does not divide model.n_heads({m.n_heads}): each key/value head serves "
            f"a whole group of query heads; choose a divisor of {m.n_heads}"
        )
    if m.rope_scaling == "llama3" and m.rope_high_freq_factor <= m.rope_low_freq_factor:
        errors.append(
            f"model.rope_high_freq_factor({m.rope_high_freq_factor}) <= model.rope_low_freq_factor"
            f"({m.rope_low_freq_factor}): llama3 scaling interpolates between the two; Llama 3.1's are 4 and 1"
        )
    return errors


def train_errors(cfg: TrainflowConfig) -> list[str]:
    """Settings that only make sense together (whether the machine can run them is trainflow.preflight's)."""
    t, errors = cfg.train, []
    if t.offload_dir and t.activations != "offload":
        errors.append(
            f"train.offload_dir({t.offload_dir!r}) is set but train.activations is {t.activations}; "
            "set train.activations=offload or leave offload_dir empty"
        )
    if t.fp8 != "none":
        errors += fp8_errors(cfg)
    return errors


def fp8_errors(cfg: TrainflowConfig) -> list[str]:
    """FP8 runs inside bf16 training, on tensor-core tiles of 16: every block linear's share on one tp rank (its
    local GEMMs; trainflow.fp8.linear runs them on the shards tensor parallel leaves) in multiples of 16."""
    t, m, tp, errors = cfg.train, cfg.model, cfg.parallel.tp, []
    if t.precision != "bf16":
        errors.append(
            f"train.fp8={t.fp8} runs inside bf16 training (its GEMMs output bf16) and train.precision is "
            f"{t.precision}; set train.precision=bf16"
        )
    per_rank = f" on each of parallel.tp({tp}) ranks" if tp > 1 else ""
    bad = [
        f"layers.*.{name} is a {d_in} -> {d_out} Linear{per_rank}"
        for name, (d_in, d_out) in linear_shapes(m, tp=tp).items()
        if d_in % FP8_TILE or d_out % FP8_TILE
    ]
    if bad:
        errors.append(
            f"train.fp8: {bad[0]}{f' (and {len(bad) - 1} more)' if len(bad) > 1 else ''}; fp8 GEMMs need in and "
            f"out features in multiples of {FP8_TILE} (tensor-core tiles): make model.dim and its head dim "
            f"(dim / n_heads) multiples of {FP8_TILE} and model.multiple_of a multiple of {FP8_TILE * tp}, or set "
            "train.fp8=none"
        )
    return errors


def spike_warning(cfg: TrainflowConfig) -> str | None:
    """A spike window the run cannot fill: the guard judges a loss once its window of applied steps is full (the
    window carries across segments), so it would judge none. Said where the run is planned (the workflow), not
    refused, and not for a test run of fewer steps than the default window (the smoke preset's 12: it said so on
    every dry run)."""
    t = cfg.train
    if t.spike.window < (steps := t.segments * t.segment_steps) or steps < SPIKE_WINDOW:
        return None
    return (
        f"train.spike.window({t.spike.window}) >= the run's {steps} steps (train.segments({t.segments}) * "
        f"segment_steps({t.segment_steps})): the spike guard judges no loss of this run (non-finite ones are still "
        f"skipped); set train.spike.window below {steps} for it to judge"
    )
