"""The configuration schema: structured-config dataclasses registered in Hydra's ConfigStore.

    python -c "from trainflow.config import TrainflowConfig; help(TrainflowConfig)"

Every primary config in conf/ starts from `trainflow_schema`, so a mistyped key fails at compose
time. A field with a domain carries it beside its type (`checked(...)`); config.checks tests every one.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import StrEnum

from hydra.core.config_store import ConfigStore
from omegaconf import MISSING

from trainflow.config.cluster import ClusterConfig
from trainflow.config.domain import PHASE_NAME, RUN_NAME, SERIES, checked
from trainflow.config.energy import EnergyConfig
from trainflow.config.evaluate import EvaluateConfig
from trainflow.config.faults import FaultConfig
from trainflow.config.observe import MlflowConfig, WandbConfig
from trainflow.config.paths import IOConfig, StorageConfig
from trainflow.config.resilience import ResilienceConfig
from trainflow.config.sources import SourceConfig
from trainflow.config.stages import STAGES

SCHEDULES = ("gpipe", "1f1b", "interleaved_1f1b")
ROPE_SCALINGS = ("none", "llama3")
"""model.rope_scaling's kinds: none, or Llama 3.1's frequency scaling (Hugging Face's rope_type llama3)."""
ACTIVATION_MODES = ("keep", "recompute", "offload")
FP8_RECIPES = ("dynamic", "delayed", "rowwise")
"""train.fp8's recipes besides none; trainflow.fp8.linear.Float8Linear implements each."""
DP_MODES = ("replicate", "shard")


class LrSchedule(StrEnum):
    """optim.schedule's kinds (config.schedule.Schedule computes each)."""

    COSINE = "cosine"
    WSD = "wsd"


class DecayShape(StrEnum):
    """optim.decay_shape: how a wsd decay falls, over its progress p from 0 to 1."""

    LINEAR = "linear"
    SQRT = "1-sqrt"
    """1 - sqrt(p): Hägele et al. 2024 ("Scaling Laws and Compute-Optimal Training Beyond Fixed Training
    Durations") report a lower final loss than a linear decay of the same length."""


BYTE_VOCAB = 257  # 256 byte values + one end-of-document token
SPIKE_WINDOW = 50
"""train.spike.window's default; a run of fewer steps is a test run (config.rules.spike_warning)."""
MAX_SEGMENTS = 4096
"""The most segments a campaign holds: each is a DAG node and a Slurm job (4096: 85 days of 30-minute jobs), and
Snakemake plans 3000 of them in 25 s (a billion never: composing one ran out of memory)."""


@dataclass(frozen=True)
class Precision:
    dtype: str
    """The torch dtype compute runs in, by name (torch is not imported here: getattr(torch, dtype))."""
    bytes: int
    """Bytes of one element of what autograd saves in it (the planner's activation memory)."""


PRECISIONS = {"fp32": Precision("float32", 4), "bf16": Precision("bfloat16", 2)}
"""train.precision -> its compute dtype: master weights, gradients and optimizer state stay fp32 in both."""


@dataclass
class ModelConfig:
    """A Llama-style decoder (trainflow.model): RMSNorm, rotary positions, SwiGLU MLP, grouped-query attention."""

    name: str = checked(pattern=RUN_NAME, fix="letters, digits, _ . - and no leading dot")
    vocab_size: int = checked(ge=2)
    """Rows of the embedding and output head; at least data.vocab_size (the tiny preset takes it from there)."""
    n_layers: int = checked(ge=1)
    n_heads: int = checked(ge=1)
    n_kv_heads: int = checked(ge=1)
    """Key/value heads, each shared by n_heads / n_kv_heads query heads (grouped-query attention)."""
    dim: int = checked(ge=1)
    ffn_dim_multiplier: float = checked(gt=0)
    multiple_of: int = checked(ge=1)
    """The SwiGLU hidden width is Llama's: 8/3 dim, times ffn_dim_multiplier, rounded up to multiple_of."""
    rope_theta: float = checked(gt=0)
    """Base of the rotary embedding's frequencies (Llama 2: 1e4, Llama 3: 5e5)."""
    rope_scaling: str = checked("none", one_of=ROPE_SCALINGS)
    """`none`, or Llama 3.1's `llama3`: wavelengths over rope_original_seq_len / rope_low_freq_factor slowed by
    rope_factor, under rope_original_seq_len / rope_high_freq_factor kept, those between interpolated (trainflow.model
    computes it as transformers' _compute_llama3_parameters; Llama 3.1 / 3.3: 8, 1, 4, 8192; 3.2: 32, 1, 4, 8192)."""
    rope_factor: float = checked(8.0, ge=1)
    rope_low_freq_factor: float = checked(1.0, gt=0)
    rope_high_freq_factor: float = checked(4.0, gt=0)
    """Above rope_low_freq_factor (config.rules checks it), so some wavelengths lie between the two."""
    rope_original_seq_len: int = checked(8192, ge=1)
    """The context the frequencies were pre-trained for (Hugging Face's original_max_position_embeddings)."""
    tie_embeddings: bool = False
    """The output head shares the embedding's weight (Llama 3.2 1B / 3B); under pipeline parallelism the first and
    last stage each hold a copy, their gradients summed every step (as Megatron does)."""
    seq_len: int = checked(ge=1)
    norm_eps: float = checked(1e-5, gt=0)
    init_std: float = checked(0.02, gt=0)

    @property
    def head_dim(self) -> int:
        return self.dim // self.n_heads

    @property
    def ffn_dim(self) -> int:
        """The SwiGLU hidden width, as Llama's FeedForward computes it."""
        hidden = int(self.ffn_dim_multiplier * int(2 * 4 * self.dim / 3))
        return self.multiple_of * -(-hidden // self.multiple_of)


@dataclass
class DataConfig:
    corpus: str = MISSING
    """Glob of input files; `<stdlib>` is this Python's standard-library folder (present everywhere). The format
    follows the suffix: `.jsonl` (one document per line) and `.parquet` (one per row) hold the text in
    text_field; any other file is one document. Each may end in `.gz` or `.zst` (compressed)."""
    text_field: str = "text"
    """The field of a JSONL object or Parquet column that holds a document's text."""
    bad_lines: str = checked("fail", one_of=("fail", "skip"))
    """A JSONL line that is no JSON object with a string text_field (or a null Parquet value): `fail` names its
    file:line; `skip` counts it in the log and the token index."""
    tokenizer: str = checked(one_of=("byte", "bpe", "pretrained"))
    """`byte` (vocabulary 257, no training), `bpe` (byte-level BPE trained on a sample of the corpus) or
    `pretrained` (the HuggingFace tokenizer.json at tokenizer_path; its end/begin-of-text tokens are taken
    from the file)."""
    tokenizer_path: str = ""
    """The tokenizer.json of data.tokenizer=pretrained (e.g. Llama-3's); data.vocab_size must be its size."""
    bpe_sample_bytes: int = checked(50_000_000, ge=1)
    """BPE trains on at most this many bytes of text, spread evenly over the shards."""
    shards: int = checked(1, ge=1)
    """Groups of input files, each tokenised by its own job into tokens/shard-NNNNN.h5."""
    stage_streams: int = checked(4, ge=1)
    """Shards stage_data copies to the fast tier at once."""
    vocab_size: int = checked(ge=2, le=2**32)
    val_fraction: float = checked(gt=0, lt=1)
    """Share of documents (chosen by a hash of their path) held out for validation."""
    max_bytes: int = checked(0, ge=0)
    """Stop reading the corpus after this many bytes (0 = no limit)."""
    chunk_tokens: int = checked(65536, ge=1)
    """HDF5 chunk length of the token datasets."""
    sources: list[SourceConfig] = field(default_factory=list)
    """A weighted mixture of named corpora (config.sources), each tokenised into its own shards; given, it replaces
    corpus, text_field and shards. Empty: data.corpus is the one source."""


@dataclass
class ParallelConfig:
    name: str = MISSING
    dp: int = checked(ge=1)
    tp: int = checked(ge=1)
    pp: int = checked(ge=1)
    cp: int = checked(1, ge=1)
    """Context parallel: ranks that split every sequence (2 x cp load-balanced chunks, K and V all-gathered per
    layer; trainflow.parallel.context). Mesh dims pp, dp, cp, tp."""
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
    dp_mode: str = checked("replicate", one_of=DP_MODES)
    """replicate: every data-parallel rank holds the whole model, gradients and AdamW state (DDP, or
    GradReducer beside tp / pp); shard: FSDP2 shards all three over dp (ZeRO-3), gathering each block's
    parameters for its forward and backward."""
    dp_shard: int = checked(0, ge=0)
    """Under dp_mode=shard, how many data-parallel ranks one shard group spans: 0 (or dp) shards over all of
    dp (FSDP); a divisor of dp between 2 and dp/2 is HSDP: dp/dp_shard replicas, each sharded dp_shard ways
    (keep a group inside a node or a fast network island, as torchtitan's data_parallel_shard_degree)."""

    @property
    def world_size(self) -> int:
        return self.dp * self.cp * self.tp * self.pp


@dataclass
class OptimConfig:
    name: str = MISSING
    lr: float = checked(gt=0)
    min_lr_ratio: float = checked(0.1, ge=0, le=1)
    """The decay ends at lr * min_lr_ratio."""
    warmup_steps: int = checked(ge=0)
    schedule: str = checked(LrSchedule.COSINE.value, one_of=tuple(LrSchedule))
    """The learning rate after warmup: cosine decays from lr over the whole run to its planned last step; wsd
    (warmup-stable-decay) holds lr, then decays over the last optim.decay_steps steps before it."""
    decay_steps: int = checked(0, ge=0)
    """wsd only: the decay takes the last decay_steps steps before the planned last step; 0: none in this plan (lr
    stays constant after warmup). A campaign's decay is usually a phase of its own, whose decay_steps is the phase's
    length: it decays from whichever stable checkpoint the phase starts at."""
    decay_shape: str = checked(DecayShape.SQRT.value, one_of=tuple(DecayShape))
    """wsd only: linear, or 1-sqrt (lr x (1 - sqrt(progress)), mapped to end at lr x min_lr_ratio)."""
    weight_decay: float = checked(ge=0)
    beta1: float = checked(0.9, ge=0, lt=1)
    beta2: float = checked(0.95, ge=0, lt=1)
    grad_clip: float = checked(ge=0)


@dataclass
class SpikeConfig:
    """The loss-spike guard (train.guard): a step whose loss or gradient norm is not finite, or whose loss exceeds the
    mean of the last `window` applied steps by more than `factor` standard deviations, is not applied."""

    window: int = checked(SPIKE_WINDOW, ge=2)
    """Applied steps the running mean and deviation of the loss cover; the guard judges spikes once it is full."""
    factor: float = checked(4.0, gt=0)
    rollback_after: int = checked(3, ge=1)
    """This many bad steps in a row reload the last verified checkpoint and skip the data windows that caused them."""


@dataclass
class TrainConfig:
    seed: int = checked(1234, ge=0)
    """Initialises the weights and draws the data: part of the campaign's identity (config.identity), recorded with its
    series; another seed on the same series is refused (branch with it instead: branch_from)."""
    segments: int = checked(
        2, ge=1, le=MAX_SEGMENTS, fix="each is a DAG node and a job: make train.segment_steps longer"
    )
    """Training is split into this many Snakemake jobs (one DAG node each; at most MAX_SEGMENTS). Raise it to extend a
    campaign: the segments already completed stay as they are."""
    segment_steps: int = checked(150, ge=1)
    """Steps of each segment not yet completed: a segment starts where the one before it ended (its lineage)."""
    branch_from: str = checked("", pattern=rf"({SERIES}@)?[0-9]+|", fix="a step, or SERIES@STEP")
    """Train a new series (a branch) from a checkpoint of this campaign: STEP (of the main series) or SERIES@STEP (of
    a branch: its name <main>-b<step>). The branch's segments count from 0 at that step; the old series stays as it
    is, and the branch's lineage names it. Empty: the main series."""
    global_batch: int = checked(16, ge=1)
    """Sequences per optimizer step, across all data-parallel ranks."""
    eval_every: int = checked(50, ge=1)
    eval_batches: int = checked(8, ge=1)
    log_every: int = checked(10, ge=1)
    deterministic: bool = True
    """Bitwise reproducible steps: deterministic algorithms, fixed threads."""
    threads_per_rank: int = checked(1, ge=1)
    precision: str = checked(
        "fp32", one_of=PRECISIONS, fix="fp16 needs loss scaling, which trainflow does not offer: use bf16"
    )
    """bf16: bf16 compute under autocast, fp32 master weights, optimizer state and gradient reduction."""
    activations: str = checked("keep", one_of=ACTIVATION_MODES)
    """What each block keeps for backward: keep (all), recompute (its input; the rest is recomputed),
    offload (all, moved to host memory, or to train.offload_dir when set)."""
    offload_dir: str = ""
    """A folder on the fast tier (e.g. node SSD) for offloaded activations; empty: host memory."""
    compile: bool | None = None
    """torch.compile each block (regional compilation, as torchtitan does). null (the default): on where train.fp8 runs
    on GPUs, where compiled the casts around each FP8 matmul fuse with what surrounds them (eager, fp8 paid less than
    bf16 on the first H200 run: docs/benchmarks.md), off elsewhere (TrainConfig.compiled)."""
    fp8: str = checked("none", one_of=("none", *FP8_RECIPES))
    """FP8 matmuls in the blocks' linears (not the embedding or the head), inside bf16 training: e4m3 weights
    and activations, e5m2 gradients, scaled per tensor from the current amax (dynamic) or from the largest
    of the last fp8_amax_history steps' amaxes (delayed, Transformer Engine's recipe), or per row of each GEMM
    operand from its current amaxes (rowwise, torchao's recipe at scale; trainflow.fp8.rowwise)."""
    fp8_amax_history: int = checked(16, ge=1)
    """Steps of amax history under train.fp8=delayed."""
    spike: SpikeConfig = field(default_factory=SpikeConfig)
    cross_document: bool = True
    """Training windows may run over an end-of-document token into the next document (GPT's packing); false
    re-draws a window until its inputs lie inside one document (data.sampler). A training setting, not a data
    one: changing it does not re-tokenise."""

    @property
    def total_steps(self) -> int:
        return self.segments * self.segment_steps

    def compiled(self, device: str) -> bool:
        """Whether blocks are compiled on `device` (cluster.runtime.device): train.compile, or where it is null, fp8
        on a GPU."""
        return self.compile if self.compile is not None else self.fp8 != "none" and device == "cuda"


@dataclass
class CheckpointConfig:
    interval_steps: int = checked(ge=0)
    """Fixed save interval; 0 = Young/Daly from the measured save time and cluster.hardware.mtbf_hours."""
    keep: int = checked(ge=1)
    """Newest checkpoints kept besides the segment-end ones."""
    io_threads: int = checked(ge=1)
    """Threads per rank that write (one file each) and read a checkpoint."""
    max_interval_steps: int = checked(1000, ge=1)
    mode: str = checked("sync", one_of=("sync", "async"))
    """sync: every rank waits until the checkpoint is durable. async: each rank stages its state to host memory (one
    extra copy of it) and trains on while a background process writes it; the same manifest and atomic publish, at a
    later step boundary (trainflow.checkpoint.background)."""
    snapshot_steps: int = checked(0, ge=0)
    """Under resilience.recovery=peers, every this many steps each rank's state is copied into its own host memory and
    sent, in the background, to the rank of the same local index on the next node (train.snapshots); a failure that
    takes every live replica of a shard then restores it from that partner's copy, every rank going back to the
    newest snapshot complete everywhere: at most this many steps lost (twice as many where the failure strikes during
    an exchange), no checkpoint read. 0: none (such a failure goes the job path)."""


@dataclass
class ObserveConfig:
    """What training records about itself beyond its step log. Read by no stage's config hash: turning it on
    for a rerun (snakemake -R train_segment) keeps the checkpoint series."""

    tensorboard: bool = True
    """TensorBoard event files of every step's metrics and evaluation, written by rank 0 under the run's
    train folder (tensorboard --logdir runs/<run>/train)."""
    profile: bool = False
    """A torch.profiler trace of profile_steps steps per segment (after one to wait and one to warm up),
    one Chrome/Perfetto JSON per rank; the report lists the top operators by self time."""
    profile_steps: int = checked(3, ge=1)
    wandb: WandbConfig = field(default_factory=WandbConfig)
    mlflow: MlflowConfig = field(default_factory=MlflowConfig)
    leak_mb: float = checked(64.0, gt=0)
    """The report flags a leak when a rank's memory (the allocator's on GPU, the resident set on CPU) grows by
    more than this from a segment's second step to its last."""


@dataclass
class PhaseConfig:
    """One phase of a campaign (config.phases): its name and its overrides over the experiment. Phase k's first
    segment starts from phase k-1's last checkpoint (or its from_step), in a checkpoint series of its own."""

    name: str = checked(pattern=PHASE_NAME, fix="lower-case letters, digits and _, starting with a letter")
    overrides: list[str] = field(default_factory=list)
    """Hydra overrides applied to this phase only, before the command line's (which apply to every phase)."""
    from_step: int = checked(0, ge=0)
    """The parent phase's checkpoint this phase starts from; 0: its last (a decay phase may start from any stable
    checkpoint of its parent)."""
    series: str = ""
    """Set by compose (config.phases): the checkpoint series the phase trains; a value given is replaced."""
    segments: int = 0
    """Set by compose: the phase's train.segments as composed; a value given is replaced."""


@dataclass
class TrainflowConfig:
    run: str = checked("default", pattern=RUN_NAME, fix="letters, digits, _ . - and no leading dot")
    """The run's name: its outputs go to runs/<run>/ (storage.root)."""
    stage: str = checked(one_of=STAGES)
    job: str = checked("", pattern=r"(tokenizer|shard-[0-9]{5})?", fix="tokenizer or shard-NNNNN (prepare_data's jobs)")
    """Which of a stage's several jobs this is: prepare_data's `tokenizer` (train the BPE) or `shard-NNNNN` (tokenise
    one group of files); '' is the stage's main job (prepare_data's: gather the shards into the index, first making
    any that are missing when it runs alone)."""
    segment: int = checked(0, ge=0)
    """Which training segment (train_segment's job)."""
    phases: list[PhaseConfig] = field(default_factory=list)
    """The campaign's phases in order (config.phases; docs/phases.md); empty: one phase, the config as it is."""
    phase: str = checked("", pattern=f"({PHASE_NAME})?", fix="the name of one of the phases")
    """Which phase this job runs ('': the first); its overrides are applied when the config is composed."""
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
    resilience: ResilienceConfig = field(default_factory=ResilienceConfig)
    fault: FaultConfig = field(default_factory=FaultConfig)
    observe: ObserveConfig = field(default_factory=ObserveConfig)
    evaluate: EvaluateConfig = field(default_factory=EvaluateConfig)
    """The evaluate stage's tasks and which checkpoints it scores (config.evaluate)."""


ConfigStore.instance().store(name="trainflow_schema", node=TrainflowConfig)
