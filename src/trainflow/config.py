"""The configuration schema: structured-config dataclasses registered in Hydra's ConfigStore.

    python -c "from trainflow.config import compose; print(compose('train_segment', ['model=tiny']))"

Every primary config in conf/ starts from `trainflow_schema`, so a mistyped key fails at compose
time. `validate` adds the cross-field checks (world size, divisibility, batch sizes) and raises one
`ConfigError` whose message names every offending factor and the fix.
"""

from __future__ import annotations

import hashlib
import json
import math
import operator
import re
from dataclasses import dataclass, field, fields, is_dataclass
from pathlib import Path, PurePosixPath
from typing import Any

from hydra.core.config_store import ConfigStore
from omegaconf import MISSING, DictConfig, OmegaConf
from omegaconf.errors import OmegaConfBaseException

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


@dataclass(frozen=True)
class Domain:
    """The values a config field may take; `domain_errors` checks every field that has one."""

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
        """Why `value` lies outside the domain (None: it does not)."""
        bounds = ((self.gt, ">", operator.gt), (self.ge, ">=", operator.ge), (self.lt, "<", operator.lt),
                  (self.le, "<=", operator.le))
        if any(b is not None for b, _, _ in bounds) and not math.isfinite(value):
            return "must be a finite number"
        for bound, sign, holds in bounds:
            if bound is not None and not holds(value, bound):
                return f"must be {sign} {bound:g}"
        if self.one_of and value not in self.one_of:
            return "must be one of " + ", ".join(self.one_of)
        if self.pattern and not re.fullmatch(self.pattern, value):
            return f"must match {self.pattern}" + (f" ({self.fix})" if self.fix else "")
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


@dataclass
class ModelConfig:
    name: str = "tiny"
    vocab_size: int = checked(ge=2)
    """Tokens in the vocabulary; the presets take it from data.vocab_size."""
    n_layers: int = checked(4, ge=1)
    n_heads: int = checked(4, ge=1)
    dim: int = checked(128, ge=1)
    ffn_dim: int = checked(512, ge=1)
    """Hidden width of the MLP (column-parallel up, row-parallel down under TP)."""
    seq_len: int = checked(128, ge=1)
    norm_eps: float = checked(1e-5, gt=0)
    init_std: float = checked(0.02, gt=0)


@dataclass
class DataConfig:
    corpus: str = "<stdlib>/*.py"
    """Glob of text files; `<stdlib>` is this Python's standard-library folder (present everywhere)."""
    tokenizer: str = checked("byte", one_of=("byte", "bpe"))
    """`byte` (vocabulary 257, no training) or `bpe` (byte-level BPE trained on the corpus)."""
    vocab_size: int = checked(BYTE_VOCAB, ge=2, le=65536)
    val_fraction: float = checked(0.05, gt=0, lt=1)
    """Share of documents (chosen by a hash of their path) held out for validation."""
    max_bytes: int = checked(0, ge=0)
    """Stop reading the corpus after this many bytes (0 = no limit)."""
    chunk_tokens: int = checked(65536, ge=1)
    """HDF5 chunk length of the token datasets."""


@dataclass
class ParallelConfig:
    name: str = "single"
    dp: int = checked(1, ge=1)
    tp: int = checked(1, ge=1)
    pp: int = checked(1, ge=1)
    virtual_stages: int = checked(1, ge=1)
    """Model chunks per pipeline rank; >= 2 only with the interleaved_1f1b schedule."""
    schedule: str = checked("1f1b", one_of=SCHEDULES)
    """Pipeline schedule: gpipe, 1f1b or interleaved_1f1b (ignored when pp = 1)."""
    microbatches: int = checked(1, ge=1)
    """Microbatches per step and data-parallel rank (the pipeline's m)."""
    bucket_mb: float = checked(25.0, gt=0)
    """Gradient all-reduce bucket size; the seed uses 128 MB-1 GB on GPU clusters."""
    overlap: bool = True
    """Overlap gradient communication with the backward pass."""

    @property
    def world_size(self) -> int:
        return self.dp * self.tp * self.pp


@dataclass
class OptimConfig:
    name: str = "adamw"
    lr: float = checked(3e-3, gt=0)
    min_lr_ratio: float = checked(0.1, ge=0, le=1)
    """Cosine decay ends at lr * min_lr_ratio."""
    warmup_steps: int = checked(20, ge=0)
    weight_decay: float = checked(0.1, ge=0)
    beta1: float = checked(0.9, ge=0, lt=1)
    beta2: float = checked(0.95, ge=0, lt=1)
    grad_clip: float = checked(1.0, ge=0)


@dataclass
class TrainConfig:
    seed: int = checked(1234, ge=0)
    segments: int = checked(2, ge=1)
    """Training is split into this many Snakemake jobs (one DAG node each)."""
    segment_steps: int = checked(150, ge=1)
    global_batch: int = checked(16, ge=1)
    """Sequences per optimizer step, across all data-parallel ranks."""
    eval_every: int = checked(50, ge=1)
    eval_batches: int = checked(8, ge=1)
    log_every: int = checked(10, ge=1)
    deterministic: bool = True
    """Bitwise reproducible steps: deterministic algorithms, fixed threads."""
    threads_per_rank: int = checked(1, ge=1)
    profile: bool = False
    """Write a torch.profiler trace of a few steps of each segment."""

    @property
    def total_steps(self) -> int:
        return self.segments * self.segment_steps


@dataclass
class CheckpointConfig:
    interval_steps: int = checked(0, ge=0)
    """Fixed save interval; 0 = Young/Daly from the measured save time and cluster.mtbf_hours."""
    keep: int = checked(3, ge=1)
    """Newest checkpoints kept besides the segment-end ones."""
    io_threads: int = checked(2, ge=1)
    """Threads per rank that write (one file each) and read a checkpoint."""
    max_interval_steps: int = checked(1000, ge=1)


@dataclass
class ClusterConfig:
    name: str = "local"
    executor: str = checked("local", one_of=("local", "slurm"))
    """submitit executor for distributed stages: `local` (processes here) or `slurm`."""
    device: str = checked("cpu", one_of=("cpu", "cuda"))
    backend: str = checked("gloo", one_of=("gloo", "nccl"))
    nodes: int = checked(1, ge=1)
    gpus_per_node: int = checked(0, ge=0)
    cpus_per_task: int = checked(1, ge=1)
    mem_gb: float = checked(2.0, gt=0)
    partition: str = checked("", pattern=SLURM_WORD)
    account: str = checked("", pattern=SLURM_WORD)
    time_min: int = checked(60, ge=1)
    """Slurm time limit of one training job; a segment longer than this is requeued."""
    signal_delay_s: int = checked(90, ge=0)
    """Seconds before the time limit at which Slurm sends USR2 (submitit's pre-timeout signal)."""
    max_requeues: int = checked(3, ge=0)
    constraint: str = checked("", pattern=SLURM_WORD)
    """Slurm node features, e.g. the seed's THP-off / vBoost node setup."""
    setup: list[str] = field(default_factory=list)
    """Shell lines run in the sbatch script before the tasks start."""
    mtbf_hours: float = checked(4.0, gt=0)
    collective_timeout_s: int = checked(300, gt=0)
    """torch.distributed collective timeout (the seed's "NCCL_TIMEOUT 300 s")."""
    env: dict[str, str] = field(default_factory=dict)
    """Environment for every rank (NCCL_* tuning lives here)."""
    peak_tflops: float = checked(0.1, gt=0)
    """Dense peak per device, for MFU; the CPU default is a stated rough figure."""
    min_busbw_gbps: float = checked(0.05, ge=0)
    """validate_nccl's gate on all_reduce bus bandwidth (seed: >= 200 GB/s on GH200)."""
    sweep_mb: list[float] = checked(factory=lambda: [0.25, 1.0, 4.0, 16.0], gt=0)
    sweep_iters: int = checked(5, ge=1)


@dataclass
class StorageConfig:
    root: str = "runs/${run}"
    capacity: str = "${storage.root}/capacity"
    """High-capacity tier (HDD / parallel FS): raw tokens, checkpoints."""
    fast: str = "${storage.root}/fast"
    """Fast tier (node SSD / flash): the staged dataset."""


@dataclass
class EnergyConfig:
    pue: float = checked(1.05, ge=1)
    """Facility energy / IT energy (seed: 1.05 with lake cooling)."""
    grid_gco2_per_kwh: float = checked(30.0, ge=0)
    """Carbon intensity of the supply (hydro-dominated grid)."""
    cpu_watts_per_core: float = checked(12.0, ge=0)
    """Stated model for CPU energy when RAPL is not readable: watts per busy core."""
    gpu_watts: float = checked(560.0, ge=0)
    """Stated model for GPU energy when NVML has no energy counter (seed: 560 W with vBoost)."""
    power_cap_w: float = checked(660.0, gt=0)
    dvfs: bool = True
    """Lower clocks while data loads, restore them for compute (seed: saves ~8 %)."""
    idle_clock_mhz: int = checked(500, gt=0)
    compute_clock_mhz: int = checked(1980, gt=0)


@dataclass
class FaultConfig:
    """Fault injection for tests and failure drills. Read by no stage's config hash, so a drill
    and its rerun without the fault share one checkpoint series."""

    step: int = checked(-1, ge=-1)
    """At the start of this step (-1: never) ..."""
    rank: int = checked(0, ge=0)
    """... this rank ..."""
    signal: str = checked("USR2", one_of=("USR2", "TERM", "KILL"))
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
    run: str = checked("default", pattern=RUN_NAME, fix="letters, digits, _ . - and no leading dot")
    """The run's name: its outputs go to runs/<run>/ (storage.root)."""
    stage: str = checked(one_of=STAGES)
    segment: int = checked(0, ge=0)
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
    errors = domain_errors(cfg) + path_errors(cfg) + env_errors(cfg.cluster.env)
    if errors:  # the cross-field rules below assume every field lies in its domain
        raise ConfigError("invalid config: " + "; ".join(errors))
    errors = parallel_errors(
        dp=p.dp, tp=p.tp, pp=p.pp, virtual_stages=p.virtual_stages, schedule=p.schedule,
        microbatches=p.microbatches, n_layers=m.n_layers, n_heads=m.n_heads, ffn_dim=m.ffn_dim,
        global_batch=t.global_batch,
    )
    if m.dim % m.n_heads:
        errors.append(f"model.dim({m.dim}) is not divisible by model.n_heads({m.n_heads})")
    if cfg.data.tokenizer == "byte" and cfg.data.vocab_size != BYTE_VOCAB:
        errors.append(f"data.vocab_size({cfg.data.vocab_size}) must be {BYTE_VOCAB} with the byte tokenizer")
    if m.vocab_size != cfg.data.vocab_size:
        errors.append(f"model.vocab_size({m.vocab_size}) != data.vocab_size({cfg.data.vocab_size})")
    if cfg.fault.rank >= p.world_size:
        errors.append(f"fault.rank({cfg.fault.rank}) must be < the world size {p.world_size}")
    c = cfg.cluster
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


def domain_errors(node: Any, prefix: str = "") -> list[str]:
    """Every field of the dataclass tree outside its Domain, as `key(value) must ...`."""
    errors = []
    for f in fields(node):
        value, key = getattr(node, f.name), prefix + f.name
        if is_dataclass(value):
            errors += domain_errors(value, key + ".")
        elif domain := f.metadata.get("domain"):
            why = next(filter(None, map(domain.violation, value if isinstance(value, list) else [value])), None)
            if why:
                errors.append(f"{key}({value!r}) {why}")
    return errors


def path_errors(cfg: TrainflowConfig) -> list[str]:
    """Storage and io paths, in order: none of UNSAFE_PATH_CHARS and no '..' (normalised, such a path
    can climb out of the folder it is declared in)."""
    paths = [(f"{section}.{f.name}", getattr(node, f.name)) for section, node in (("storage", cfg.storage), ("io", cfg.io))
             for f in fields(node)]
    for key, value in paths:
        for path in value if isinstance(value, list) else [value]:
            if bad := re.search(UNSAFE_PATH_CHARS, path):
                return [f"{key}({path!r}) holds {bad[0]!r}, which trainflow does not pass to a shell or Hydra; rename it"]
            if ".." in PurePosixPath(path).parts:
                return [f"{key}({path!r}) climbs out of its folder through '..'; give the path without '..'"]
    return []  # one error at most: the paths derive from each other, so the first names the cause


# Quotes, backslashes and `$` would need escaping twice (shell, then Hydra's quoted strings); control
# characters break command lines and logs. Spaces, commas, brackets and the like are fine: stage command
# lines quote every path for both.
UNSAFE_PATH_CHARS = r"[\x00-\x1f\x7f'\"\\$`]"


# Variables the ranks may be given (cluster.env): the communication and threading libraries' own. Names
# that make a library load code (NCCL's *_PLUGIN) or write where they say (NCCL_DEBUG_FILE) are refused.
ENV_NAME = r"(NCCL|TORCH|CUDA|FI|UCX|GLOO|OMP|MKL|MPICH|NVSHMEM|CXI)_[A-Z0-9_]+"
ENV_REFUSED = r".*PLUGIN.*|NCCL_DEBUG_FILE"


def env_errors(env: dict[str, str]) -> list[str]:
    errors = []
    for name, value in env.items():
        if not re.fullmatch(ENV_NAME, name) or re.fullmatch(ENV_REFUSED, name):
            errors.append(
                f"cluster.env.{name} is not a variable trainflow passes to ranks: only NCCL_*, TORCH_*, CUDA_*, FI_*, "
                "UCX_*, GLOO_*, OMP_*, MKL_*, MPICH_*, NVSHMEM_*, CXI_* (none that loads a plugin or names a file to write)"
            )
        elif re.search(r"[\x00-\x1f\x7f]", str(value)):
            errors.append(f"cluster.env.{name}({value!r}) holds a control character; give a one-line value")
    return errors


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
    if (m := re.search(r"full_key: (\S+)", text)):
        return f"bad value for '{m[1]}': {text.splitlines()[0]}"
    return " ".join(text.split())


def to_config(raw: DictConfig) -> TrainflowConfig:
    """Resolve interpolations, turn the DictConfig into the dataclass tree and validate it."""
    raw = OmegaConf.masked_copy(raw, [k for k in raw if k != "hydra"]) if "hydra" in raw else raw
    try:
        OmegaConf.resolve(raw)
        cfg = OmegaConf.to_object(raw)
    except OmegaConfBaseException as err:  # an interpolation that resolves to a wrong type or nothing
        raise ConfigError(one_line(err)) from err
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
