"""The configuration schema: structured-config dataclasses registered in Hydra's ConfigStore.

    python -c "from trainflow.config import compose; print(compose('train_segment', ['model=tiny']))"

Every primary config in conf/ starts from `trainflow_schema`, so a mistyped key fails at compose
time. `validate` adds the cross-field checks (world size, divisibility, batch sizes) and raises one
`ConfigError` whose message names every offending factor and the fix.
"""

from __future__ import annotations

import hashlib
import json
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from hydra.core.config_store import ConfigStore
from omegaconf import MISSING, DictConfig, OmegaConf

# conf/ lives at the repository root; trainflow is installed editable (`pip install -e .`).
CONF_DIR = Path(__file__).resolve().parents[2] / "conf"
STAGES = (
    "prepare_data",
    "stage_data",
    "validate_nccl",
    "train_segment",
    "verify_checkpoint",
    "account_energy",
    "report",
)
SCHEDULES = ("gpipe", "1f1b", "interleaved_1f1b")
BYTE_VOCAB = 257  # 256 byte values + one end-of-document token


class TrainflowError(Exception):
    """An expected failure: bad config, data, checkpoint or signal. One line naming the value and the fix."""


class ConfigError(TrainflowError, ValueError):
    """A configuration that cannot run."""


@dataclass
class ModelConfig:
    name: str = "tiny"
    vocab_size: int = MISSING
    """Tokens in the vocabulary; the presets take it from data.vocab_size."""
    n_layers: int = 4
    n_heads: int = 4
    dim: int = 128
    ffn_dim: int = 512
    """Hidden width of the MLP (column-parallel up, row-parallel down under TP)."""
    seq_len: int = 128
    norm_eps: float = 1e-5
    init_std: float = 0.02


@dataclass
class DataConfig:
    corpus: str = "<stdlib>/*.py"
    """Glob of text files; `<stdlib>` is this Python's standard-library folder (present everywhere)."""
    tokenizer: str = "byte"
    """`byte` (vocabulary 257, no training) or `bpe` (byte-level BPE trained on the corpus)."""
    vocab_size: int = BYTE_VOCAB
    val_fraction: float = 0.05
    """Share of documents (chosen by a hash of their path) held out for validation."""
    max_bytes: int = 0
    """Stop reading the corpus after this many bytes (0 = no limit)."""
    chunk_tokens: int = 65536
    """HDF5 chunk length of the token datasets."""


@dataclass
class ParallelConfig:
    name: str = "single"
    dp: int = 1
    tp: int = 1
    pp: int = 1
    virtual_stages: int = 1
    """Model chunks per pipeline rank; >= 2 only with the interleaved_1f1b schedule."""
    schedule: str = "1f1b"
    """Pipeline schedule: gpipe, 1f1b or interleaved_1f1b (ignored when pp = 1)."""
    microbatches: int = 1
    """Microbatches per step and data-parallel rank (the pipeline's m)."""
    bucket_mb: float = 25.0
    """Gradient all-reduce bucket size; the seed uses 128 MB-1 GB on GPU clusters."""
    overlap: bool = True
    """Overlap gradient communication with the backward pass."""

    @property
    def world_size(self) -> int:
        return self.dp * self.tp * self.pp


@dataclass
class OptimConfig:
    name: str = "adamw"
    lr: float = 3e-3
    min_lr_ratio: float = 0.1
    """Cosine decay ends at lr * min_lr_ratio."""
    warmup_steps: int = 20
    weight_decay: float = 0.1
    beta1: float = 0.9
    beta2: float = 0.95
    grad_clip: float = 1.0


@dataclass
class TrainConfig:
    seed: int = 1234
    segments: int = 2
    """Training is split into this many Snakemake jobs (one DAG node each)."""
    segment_steps: int = 150
    global_batch: int = 16
    """Sequences per optimizer step, across all data-parallel ranks."""
    eval_every: int = 50
    eval_batches: int = 8
    log_every: int = 10
    deterministic: bool = True
    """Bitwise reproducible steps: deterministic algorithms, fixed threads."""
    threads_per_rank: int = 1
    profile: bool = False
    """Write a torch.profiler trace of a few steps of each segment."""

    @property
    def total_steps(self) -> int:
        return self.segments * self.segment_steps


@dataclass
class CheckpointConfig:
    interval_steps: int = 0
    """Fixed save interval; 0 = Young/Daly from the measured save time and cluster.mtbf_hours."""
    keep: int = 3
    """Newest checkpoints kept besides the segment-end ones."""
    io_threads: int = 2
    """Threads per rank that write (one file each) and read a checkpoint."""
    max_interval_steps: int = 1000


@dataclass
class ClusterConfig:
    name: str = "local"
    executor: str = "local"
    """submitit executor for distributed stages: `local` (processes here) or `slurm`."""
    device: str = "cpu"
    backend: str = "gloo"
    nodes: int = 1
    gpus_per_node: int = 0
    cpus_per_task: int = 1
    mem_gb: float = 2.0
    partition: str = ""
    account: str = ""
    time_min: int = 60
    """Slurm time limit of one training job; a segment longer than this is requeued."""
    signal_delay_s: int = 90
    """Seconds before the time limit at which Slurm sends USR2 (submitit's pre-timeout signal)."""
    max_requeues: int = 3
    constraint: str = ""
    """Slurm node features, e.g. the seed's THP-off / vBoost node setup."""
    setup: list[str] = field(default_factory=list)
    """Shell lines run in the sbatch script before the tasks start."""
    mtbf_hours: float = 4.0
    collective_timeout_s: int = 300
    """torch.distributed collective timeout (the seed's "NCCL_TIMEOUT 300 s")."""
    env: dict[str, str] = field(default_factory=dict)
    """Environment for every rank (NCCL_* tuning lives here)."""
    peak_tflops: float = 0.1
    """Dense peak per device, for MFU; the CPU default is a stated rough figure."""
    min_busbw_gbps: float = 0.05
    """validate_nccl's gate on all_reduce bus bandwidth (seed: >= 200 GB/s on GH200)."""
    sweep_mb: list[float] = field(default_factory=lambda: [0.25, 1.0, 4.0, 16.0])
    sweep_iters: int = 5


@dataclass
class StorageConfig:
    root: str = "runs/${run}"
    capacity: str = "${storage.root}/capacity"
    """High-capacity tier (HDD / parallel FS): raw tokens, checkpoints."""
    fast: str = "${storage.root}/fast"
    """Fast tier (node SSD / flash): the staged dataset."""


@dataclass
class EnergyConfig:
    pue: float = 1.05
    """Facility energy / IT energy (seed: 1.05 with lake cooling)."""
    grid_gco2_per_kwh: float = 30.0
    """Carbon intensity of the supply (hydro-dominated grid)."""
    cpu_watts_per_core: float = 12.0
    """Stated model for CPU energy when RAPL is not readable: watts per busy core."""
    gpu_watts: float = 560.0
    """Stated model for GPU energy when NVML has no energy counter (seed: 560 W with vBoost)."""
    power_cap_w: float = 660.0
    dvfs: bool = True
    """Lower clocks while data loads, restore them for compute (seed: saves ~8 %)."""
    idle_clock_mhz: int = 500
    compute_clock_mhz: int = 1980


@dataclass
class FaultConfig:
    """Fault injection for tests and failure drills. Read by no stage's config hash, so a drill
    and its rerun without the fault share one checkpoint series."""

    step: int = -1
    """At the start of this step (-1: never) ..."""
    rank: int = 0
    """... this rank ..."""
    signal: str = "USR2"
    """... receives this signal: USR2 (Slurm's pre-timeout), TERM, or KILL (a dead rank)."""
    during_save: bool = False
    """Instead: the rank dies inside the checkpoint write of this step, after the shards, before the rename."""


@dataclass
class IOConfig:
    """Paths; Snakemake passes every one it owns as an override."""

    tokens: str = "${storage.capacity}/data/tokens.h5"
    staged_tokens: str = "${storage.fast}/data/tokens.h5"
    nccl_report: str = "${storage.root}/nccl.json"
    checkpoints: str = "${storage.capacity}/checkpoints"
    resume_from: str = ""
    """Another run's checkpoint folder to start from when `checkpoints` holds none; DCP reshards it,
    so the layout may differ (e.g. dp2 x tp2 x pp2 -> dp4 x tp2)."""
    segment_report: str = "${storage.root}/segments/segment-${segment}.json"
    segment_reports: list[str] = field(default_factory=list)
    verify_report: str = "${storage.root}/verify.json"
    energy_report: str = "${storage.root}/energy.json"
    stage_metrics: str = "${storage.root}/metrics/${stage}.json"
    metrics: list[str] = field(default_factory=list)
    report: str = "${storage.root}/report/report.md"
    submitit: str = "${storage.root}/submitit"


@dataclass
class TrainflowConfig:
    run: str = "default"
    stage: str = MISSING
    segment: int = 0
    io: IOConfig = field(default_factory=IOConfig)
    model: ModelConfig = field(default_factory=ModelConfig)
    data: DataConfig = field(default_factory=DataConfig)
    parallel: ParallelConfig = field(default_factory=ParallelConfig)
    optim: OptimConfig = field(default_factory=OptimConfig)
    train: TrainConfig = field(default_factory=TrainConfig)
    checkpoint: CheckpointConfig = field(default_factory=CheckpointConfig)
    cluster: ClusterConfig = field(default_factory=ClusterConfig)
    storage: StorageConfig = field(default_factory=StorageConfig)
    energy: EnergyConfig = field(default_factory=EnergyConfig)
    fault: FaultConfig = field(default_factory=FaultConfig)


ConfigStore.instance().store(name="trainflow_schema", node=TrainflowConfig)

# The config subtrees each stage reads: their hash is the rule's params, so a change reruns exactly
# the stages that read it (and, through their outputs, what follows).
STAGE_READS: dict[str, tuple[str, ...]] = {
    "prepare_data": ("data",),
    "stage_data": ("data",),
    "validate_nccl": ("parallel", "cluster"),
    "train_segment": ("model", "data", "parallel", "optim", "train", "checkpoint", "cluster"),
    "verify_checkpoint": (),
    "account_energy": ("energy", "cluster"),
    "report": ("model", "parallel", "train", "cluster", "energy"),
}


def validate(cfg: TrainflowConfig) -> None:
    """Cross-field checks; raises one ConfigError listing every violation with its fix."""
    p, m, t = cfg.parallel, cfg.model, cfg.train
    errors = parallel_errors(
        dp=p.dp, tp=p.tp, pp=p.pp, virtual_stages=p.virtual_stages, schedule=p.schedule,
        microbatches=p.microbatches, n_layers=m.n_layers, n_heads=m.n_heads, ffn_dim=m.ffn_dim,
        global_batch=t.global_batch,
    )
    if m.dim % m.n_heads:
        errors.append(f"model.dim({m.dim}) is not divisible by model.n_heads({m.n_heads})")
    if cfg.data.tokenizer not in ("byte", "bpe"):
        errors.append(f"data.tokenizer({cfg.data.tokenizer!r}) must be 'byte' or 'bpe'")
    if cfg.data.tokenizer == "byte" and cfg.data.vocab_size != BYTE_VOCAB:
        errors.append(f"data.vocab_size({cfg.data.vocab_size}) must be {BYTE_VOCAB} with the byte tokenizer")
    if m.vocab_size != cfg.data.vocab_size:
        errors.append(f"model.vocab_size({m.vocab_size}) != data.vocab_size({cfg.data.vocab_size})")
    if not 0 < cfg.data.val_fraction < 1:
        errors.append(f"data.val_fraction({cfg.data.val_fraction}) must lie in (0, 1)")
    if t.segments < 1 or t.segment_steps < 1:
        errors.append(f"train.segments({t.segments}) and train.segment_steps({t.segment_steps}) must be >= 1")
    ck = cfg.checkpoint
    if ck.keep < 1 or ck.io_threads < 1:
        errors.append(f"checkpoint.keep({ck.keep}) and checkpoint.io_threads({ck.io_threads}) must be >= 1")
    c = cfg.cluster
    if c.executor not in ("local", "slurm"):
        errors.append(f"cluster.executor({c.executor!r}) must be 'local' or 'slurm'")
    if p.world_size % c.nodes:
        errors.append(
            f"world size dp({p.dp}) * tp({p.tp}) * pp({p.pp}) = {p.world_size} is not divisible by "
            f"cluster.nodes({c.nodes}); change the layout or the node count"
        )
    elif c.gpus_per_node and p.world_size // c.nodes != c.gpus_per_node:
        errors.append(
            f"world size {p.world_size} / cluster.nodes({c.nodes}) = {p.world_size // c.nodes} tasks per node "
            f"!= cluster.gpus_per_node({c.gpus_per_node}); one task drives one GPU"
        )
    if errors:
        raise ConfigError("invalid config: " + "; ".join(errors))


def parallel_errors(
    *, dp: int, tp: int, pp: int, virtual_stages: int, schedule: str, microbatches: int,
    n_layers: int, n_heads: int, ffn_dim: int, global_batch: int,
) -> list[str]:
    """The layout rules of hybrid parallelism, one message per broken rule."""
    errors = []
    for name, value in (("dp", dp), ("tp", tp), ("pp", pp), ("virtual_stages", virtual_stages),
                        ("microbatches", microbatches)):
        if value < 1:
            errors.append(f"parallel.{name}({value}) must be >= 1")
    if errors:
        return errors
    if schedule not in SCHEDULES:
        errors.append(f"parallel.schedule({schedule!r}) must be one of {', '.join(SCHEDULES)}")
    if n_layers % (pp * virtual_stages):
        errors.append(
            f"model.n_layers({n_layers}) is not divisible by pp({pp}) * virtual_stages({virtual_stages}) "
            f"= {pp * virtual_stages} pipeline chunks"
        )
    if n_heads % tp:
        errors.append(f"model.n_heads({n_heads}) is not divisible by tp({tp}); choose tp dividing {n_heads}")
    if ffn_dim % tp:
        errors.append(f"model.ffn_dim({ffn_dim}) is not divisible by tp({tp})")
    if schedule == "interleaved_1f1b" and pp > 1 and virtual_stages < 2:
        errors.append(f"schedule interleaved_1f1b needs virtual_stages({virtual_stages}) >= 2")
    if schedule != "interleaved_1f1b" and virtual_stages != 1:
        errors.append(f"virtual_stages({virtual_stages}) > 1 needs schedule interleaved_1f1b, not {schedule}")
    if pp > 1 and schedule != "gpipe" and microbatches < pp:
        errors.append(f"schedule {schedule} needs microbatches({microbatches}) >= pp({pp})")
    if pp == 1 and microbatches != 1:
        errors.append(f"microbatches({microbatches}) > 1 needs pp > 1 (they feed the pipeline)")
    if global_batch % (dp * microbatches):
        errors.append(
            f"train.global_batch({global_batch}) is not divisible by dp({dp}) * microbatches({microbatches}) "
            f"= {dp * microbatches}"
        )
    return errors


def compose(config_name: str, overrides: list[str] | tuple[str, ...] = ()) -> TrainflowConfig:
    """Compose a primary config with Hydra's compose API, resolve it and validate it."""
    from hydra import compose as hydra_compose
    from hydra import initialize_config_dir
    from hydra.core.global_hydra import GlobalHydra

    GlobalHydra.instance().clear()
    try:
        with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
            raw = hydra_compose(config_name=config_name, overrides=list(overrides))
    except Exception as err:  # Hydra's errors span lines; ours are one line with the fix
        raise ConfigError(one_line(err)) from err
    return to_config(raw)


def one_line(err: BaseException) -> str:
    """Hydra/OmegaConf composition errors as one line: the innermost cause names the key."""
    cause = err
    while cause.__cause__ is not None:
        cause = cause.__cause__
    text = str(cause)
    if (m := re.search(r"Key '(.+?)' not in '(\w+)'\s+full_key: (\S+)", text)):
        return f"unknown config key '{m[3]}' ({m[2]} has no field '{m[1]}'): check its spelling in conf/ or src/trainflow/config.py"
    if (m := re.search(r"Could not find '(.+?)'\s+Available options in '(.+?)':((?:\s+\S+)+?)\s+Config search path", text)):
        return f"no config option '{m[1]}': choose one of {', '.join(m[3].split())} for {m[2]}"
    if (m := re.search(r"(Value .+?)\s+full_key: (\S+)", text)):
        return f"bad value for '{m[2]}': {m[1]}"
    return " ".join(text.split())


def to_config(raw: DictConfig) -> TrainflowConfig:
    """Resolve interpolations, turn the DictConfig into the dataclass tree and validate it."""
    raw = OmegaConf.masked_copy(raw, [k for k in raw if k != "hydra"]) if "hydra" in raw else raw
    OmegaConf.resolve(raw)
    cfg = OmegaConf.to_object(raw)
    assert isinstance(cfg, TrainflowConfig)
    validate(cfg)
    return cfg


def as_dict(node: Any) -> Any:
    """A plain dict of a config dataclass (or subtree)."""
    return OmegaConf.to_container(OmegaConf.structured(node), resolve=True)


def config_hash(cfg: TrainflowConfig, sections: tuple[str, ...]) -> str:
    """A short stable hash of the named config subtrees."""
    blob = json.dumps({s: as_dict(getattr(cfg, s)) for s in sections}, sort_keys=True)
    return hashlib.sha256(blob.encode()).hexdigest()[:12]


def stdlib_dir() -> str:
    import sysconfig

    return sysconfig.get_paths()["stdlib"]
