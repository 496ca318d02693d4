"""The cluster, by concern: the allocation a distributed stage submits, how its ranks run, the hardware model the
planner rests on, and the collective gate's thresholds. One preset per cluster in conf/cluster/, each value with
its source beside it.

    python -c "from trainflow.config import compose; print(compose('train_segment', ['cluster=alps_gh200']).cluster)"
"""

from __future__ import annotations

from dataclasses import dataclass, field

from omegaconf import MISSING

from trainflow.config.domain import BIND_MOUNT, CONTAINER_FILE, SLURM_WORD, checked
from trainflow.config.startup import StartupConfig

GATE_PATTERNS = (
    "dp_all_reduce",
    "dp_reduce_scatter",
    "dp_all_gather",
    "tp_all_reduce",
    "pp_send_recv",
    "cp_all_gather",
)
"""The collectives validate_nccl times on the layout's own groups: <mesh dim>_<op> (trainflow.gate)."""
VERSION_COMPONENTS = ("image", "uenv", "torch", "cuda", "nccl", "libfabric", "aws_ofi_nccl")
"""The software stack validate_nccl and every training job read on every node, inside the ranks' environment
(trainflow.stack), and cluster.gate.versions_allowed may pin: the container image (name@digest) or uenv, then the
versions."""


@dataclass
class ContainerConfig:
    """Where the ranks of validate_nccl and train_segment run (trainflow.launch.container): in the environment of
    the process that submits them (both empty, the default), in CSCS's Container Engine (Enroot + Pyxis) from an
    EDF, or in an Apptainer image. The light stages run wherever Snakemake runs."""

    edf: str = checked(
        "", pattern=CONTAINER_FILE, fix="a path to a .toml EDF or an EDF name, e.g. profiles/slurm/alps.toml"
    )
    """An Environment Definition File: srun --environment=<edf> (a .toml path, or a name in the EDF search path,
    ~/.edf); its image, mounts and hooks are the EDF's."""
    sif: str = checked("", pattern=CONTAINER_FILE, fix="a path to an Apptainer image, e.g. containers/trainflow.sif")
    """An Apptainer image (.sif, built from containers/trainflow.def): srun ... apptainer exec <sif> <python>."""
    binds: list[str] = checked(factory=list, pattern=BIND_MOUNT, fix="src[:dst[:ro|rw]] with plain paths")
    """Apptainer's bind mounts (--bind), e.g. the storage roots; an EDF lists its own mounts."""
    python: str = checked("python3", pattern=CONTAINER_FILE + "+", fix="python3, or an absolute path inside the image")
    """The interpreter inside the container that has trainflow (scripts/bootstrap.sh --system-torch put it there)."""


@dataclass
class AllocationConfig:
    """The job validate_nccl and train_segment submit through submitit: LocalExecutor's processes here, a Slurm job
    (sbatch + srun) on a cluster."""

    executor: str = checked(one_of=("local", "slurm"))
    nodes: int = checked(ge=1)
    gpus_per_node: int = checked(ge=0)
    """GPUs per node, one task each (0: CPU ranks)."""
    cpus_per_task: int = checked(ge=1)
    mem_gb: float = checked(gt=0)
    time_min: int = checked(ge=1)
    """Slurm time limit of one training job; a segment longer than this is requeued."""
    signal_delay_s: int = checked(ge=0)
    """Seconds before the time limit at which Slurm sends USR2 (submitit's pre-timeout signal)."""
    max_requeues: int = checked(3, ge=0)
    """Slurm requeues of one job on its pre-timeout signal (submitit's)."""
    spare_nodes: int = checked(0, ge=0)
    """Nodes the job holds beyond `nodes` for hot restarts (launch.supervisor): training runs as a job step on `nodes`
    of them, and after a dead or hung rank a supervisor inside the allocation starts a new step on the healthy nodes
    plus a spare (the failed node left out), resuming from the newest verified checkpoint with no new job and no
    queue; once the spares are used up the next restart is a new job. 0: every restart is a new job. On one machine
    (executor local) the job's processes restart inside the same local job up to this many times, the host left
    out only recorded."""
    partition: str = checked("", pattern=SLURM_WORD)
    account: str = checked("", pattern=SLURM_WORD)
    constraint: str = checked("", pattern=SLURM_WORD)
    """Slurm node features, e.g. the seed's THP-off / vBoost node setup."""
    setup: list[str] = field(default_factory=list)
    """Shell lines run in the sbatch script before the tasks start (a reviewed preset's only: overrides refuse it)."""
    container: ContainerConfig = field(default_factory=ContainerConfig)
    """The container the ranks run in (none: the submitter's environment)."""


@dataclass
class RuntimeConfig:
    """How every rank of a job runs."""

    device: str = checked(one_of=("cpu", "cuda"))
    backend: str = checked(one_of=("gloo", "nccl"))
    collective_timeout_s: int = checked(gt=0)
    """torch.distributed collective timeout (the seed's "NCCL_TIMEOUT 300 s")."""
    env: dict[str, str] = field(default_factory=dict)
    """Environment for every rank (NCCL_* tuning lives here)."""


MIN_RATE = 1e-3
"""The slowest rate the planner takes (1 GFLOP/s, 1 MB/s): below it no step or save ends in a campaign's time, and a
plan of 1e-300 TFLOP/s printed 300-digit seconds."""
GBPS = "GB/s: a local disk or loopback is about 0.5-1, an NVLink or NIC tens to hundreds"


@dataclass
class HardwareConfig:
    """The hardware as the planner models it (trainflow.plan) and MFU measures against; each preset states the
    source of every value beside it."""

    peak_tflops: float = checked(
        ge=MIN_RATE, fix="one device's dense TFLOP/s: a CPU core's is about 0.1, an H100's 989"
    )
    """Dense peak per device, for MFU; the CPU default is a stated rough figure."""
    matmul_efficiency: float = checked(ge=0.01, le=1, fix="a share of peak_tflops: large bf16 GEMMs reach about 0.7")
    """Share of peak_tflops the model's matmuls reach (large bf16 GEMMs on Hopper: ~0.7)."""
    fp8_speedup: float = checked(ge=1)
    """Matmul throughput of FP8 over bf16 (Hopper's dense FP8 peak is twice its bf16 peak): the planner's FP8 remedy."""
    memory_gbps: float = checked(ge=MIN_RATE, fix=GBPS)
    """Device memory bandwidth, for the optimizer step (memory-bound; GH200 HBM3: 4 TB/s)."""
    intra_node_gbps: float = checked(ge=MIN_RATE, fix=GBPS)
    """Bandwidth per direction between two devices of a node (GH200 in an Alps node: 6 NVLink-4 links, 150 GB/s)."""
    intra_node_latency_us: float = checked(ge=0)
    """One hop inside a node, per message."""
    inter_node_gbps: float = checked(ge=MIN_RATE, fix=GBPS)
    """Network bandwidth per device per direction (Alps: one 200 Gb/s Slingshot-11 NIC per GH200)."""
    inter_node_latency_us: float = checked(ge=0)
    """One hop across the network, per message."""
    allreduce_algorithm: str = checked(one_of=("ring", "tree"))
    """The all-reduce the plan assumes; match runtime.env's NCCL_ALGO where it is set."""
    overlap_fraction: float = checked(ge=0, le=1)
    """Share of backward during which the bucketed gradient all-reduce runs hidden (pp = 1, parallel.overlap)."""
    storage_write_gbps: float = checked(ge=MIN_RATE, fix=GBPS)
    """Aggregate checkpoint write bandwidth of storage.capacity (the seed: 847 GB of 70B state in 2 min)."""
    device_memory_gb: float = checked(gt=0)
    """Memory of one device the plan must fit in (GH200: 96 GB HBM3); on a CPU device the node's host memory,
    which the plan shares among the node's ranks."""
    mtbf_hours: float = checked(gt=0)
    """Mean time between failures of the allocation: Young/Daly's interval (the planner's and the trainer's)."""
    hang_share: float = checked(ge=0, le=1)
    """Share of failures in which a rank hangs (a lost host or link, a stuck collective) instead of exiting with an
    error: the goodput plan weighs resilience.hang_detect_s and resilience.failure_detect_s by it
    (trainflow.plan.goodput)."""
    symmetric_share: float = checked(ge=0, le=1)
    """Share of failures no rank's or node's evidence pins: a hang in which every rank waits (a failed link or
    switch) and an NCCL error no node confirms. trainflow checks the job's hosts before restarting after one (the
    gate's checks: a job step on the allocation with spares, launch.supervisor; a job of its own without), which the
    goodput plan adds to those restarts (trainflow.plan.scenarios.check_times)."""
    requeue_wait_s: float = checked(ge=0)
    """How long a new job waits for its allocation: after a failure, or when a job reaches its time limit."""
    startup_s: float | None = checked(None, ge=0)
    """From a job's start to its first step, the checkpoint load aside: processes, imports, process groups, the
    model's build. None: the start-up model's sum at the campaign's world size (`startup`, trainflow.plan.startup)."""
    hot_restart_s: float | None = checked(None, ge=0)
    """The same for an in-job restart onto spare nodes the job already holds, from the failure: no allocation wait.
    None: the start-up model's sum with the supervisor's verdict."""
    startup: StartupConfig | None = None
    """The start-up's parts, each a law in the world size fitted to the drills (config.startup); None: startup_s and
    hot_restart_s must be set."""
    checkpoint_read_gbps: float = checked(ge=MIN_RATE, fix=GBPS)
    """Aggregate read bandwidth of storage.capacity when a job loads a checkpoint."""
    host_copy_gbps: float = checked(gt=0)
    """Device-to-host copy bandwidth per device: what an asynchronous checkpoint blocks training for is the copy of
    the rank's state into host memory; the storage write runs behind it."""
    crc_gbps: float = checked(16.0, ge=MIN_RATE, fix=GBPS)
    """CRC-32C rate of one core (the crc32c package on the CPU's CRC32 instruction, trainflow.crc: 15-16 GB/s measured
    on the development VM's AMD EPYC core; not measured on a cluster's CPUs): a recovery from peers checks the state it
    sends and receives at it (trainflow.plan.peers)."""


@dataclass
class GateConfig:
    """validate_nccl's thresholds: what the collective network, the nodes' software stack and the checkpoint
    folder must show before training starts."""

    min_busbw_gbps: float = checked(ge=0)
    """The all_reduce sweep over the whole world, at its largest message (seed: >= 200 GB/s on GH200)."""
    sweep_mb: list[float] = checked(gt=0)
    sweep_iters: int = checked(ge=1)
    busbw_gbps: dict[str, float] = field(default_factory=dict)
    """Per pattern of the layout (dp_all_reduce, dp_reduce_scatter, dp_all_gather, tp_all_reduce, pp_send_recv,
    cp_all_gather), on
    the slowest group's bus bandwidth at the largest sweep_mb; a pattern left out is measured and reported, not
    gated."""
    versions_allowed: dict[str, list[str]] = field(default_factory=dict)
    """Version prefixes every node must match, per component (torch, cuda, nccl, libfabric, aws_ofi_nccl): the
    compatibility table (the seed lost 30 % to an NCCL / libfabric mismatch). A component left out is not checked."""
    min_stripe_count: int = checked(0, ge=0)
    """Lustre stripe count the checkpoint folder needs (seed: >= 4), read with `lfs getstripe -c` where lfs exists."""


GOODPUT_INPUTS = {
    "mtbf_hours": "h",
    "hang_share": "",
    "symmetric_share": "",
    "requeue_wait_s": "s",
    "startup_s": "s",
    "hot_restart_s": "s",
    "storage_write_gbps": "GB/s",
    "checkpoint_read_gbps": "GB/s",
    "host_copy_gbps": "GB/s",
    "inter_node_gbps": "GB/s",
    "crc_gbps": "GB/s",
}
"""The cluster.hardware values the goodput plan rests on (trainflow.plan.goodput), with their units: each is printed
"measured at scale" where cluster.measured says where, else "not measured at scale"."""


@dataclass
class ClusterConfig:
    name: str = MISSING
    allocation: AllocationConfig = field(default_factory=AllocationConfig)
    runtime: RuntimeConfig = field(default_factory=RuntimeConfig)
    hardware: HardwareConfig = field(default_factory=HardwareConfig)
    gate: GateConfig = field(default_factory=GateConfig)
    measured: dict[str, str] = field(default_factory=dict)
    """Which goodput inputs (GOODPUT_INPUTS, cluster.hardware.<name>) and start-up parts (config.startup.StartupPart,
    by name) a run at the campaign's own scale measured, each with where ("run alps-70b, 2026-11-02, 4096 ranks: sacct
    Start - Submit"). The plan prints every other input and part "not measured at scale": a figure from a drill of 2
    ranks, a datasheet or an estimate is a guess at 4096."""
