"""The layout rules of hybrid parallelism, checked when a config is composed, and ParallelDims, the
validated layout the ranks build their mesh from (trainflow.parallel.mesh: this module imports no torch).

    python -c "from trainflow.config.layout import ParallelDims as P; P(dp=64, tp=8, pp=8, world_size=4096)"
"""

from __future__ import annotations

from dataclasses import dataclass

from trainflow.config.schema import ModelConfig, ParallelConfig
from trainflow.config.shape import linear_shapes
from trainflow.errors import ConfigError
from trainflow.records import Record


def parallel_errors(p: ParallelConfig, m: ModelConfig, *, global_batch: int) -> list[str]:
    """The layout rules of hybrid parallelism, one message per broken rule; each value already lies in its domain
    (the schema's `checked(...)`, which config.checks tests first)."""
    dp, tp, pp = p.dp, p.tp, p.pp
    virtual_stages, schedule, microbatches = p.virtual_stages, p.schedule, p.microbatches
    errors = []
    if m.n_layers % (pp * virtual_stages):
        errors.append(
            f"model.n_layers({m.n_layers}) is not divisible by pp({pp}) * virtual_stages({virtual_stages}) "
            f"= {pp * virtual_stages} pipeline chunks"
        )
    # Tensor parallel splits whole query heads, whole key/value heads and the SwiGLU width.
    if m.n_heads % tp:
        errors.append(f"model.n_heads({m.n_heads}) is not divisible by tp({tp}); choose tp dividing {m.n_heads}")
    if m.n_kv_heads % tp:
        errors.append(
            f"model.n_kv_heads({m.n_kv_heads}) is not divisible by tp({tp}); choose tp dividing {m.n_kv_heads} "
            "(each rank needs whole key/value heads)"
        )
    if m.ffn_dim % tp:
        errors.append(
            f"the SwiGLU width {m.ffn_dim} (model.dim, ffn_dim_multiplier, multiple_of) is not divisible by tp({tp}); "
            "make model.multiple_of a multiple of tp"
        )
    if schedule == "interleaved_1f1b" and pp > 1 and virtual_stages < 2:
        errors.append(f"schedule interleaved_1f1b needs virtual_stages({virtual_stages}) >= 2")
    if schedule != "interleaved_1f1b" and virtual_stages != 1:
        errors.append(f"virtual_stages({virtual_stages}) > 1 needs schedule interleaved_1f1b, not {schedule}")
    if pp > 1 and schedule != "gpipe" and microbatches < pp:
        errors.append(f"schedule {schedule} needs microbatches({microbatches}) >= pp({pp})")
    if pp == 1 and microbatches != 1:
        errors.append(f"microbatches({microbatches}) > 1 needs pp > 1 (they feed the pipeline)")
    errors += shard_errors(p, m) + cp_errors(p, m)
    if global_batch % (dp * microbatches):
        errors.append(
            f"train.global_batch({global_batch}) is not divisible by dp({dp}) * microbatches({microbatches}) "
            f"= {dp * microbatches}"
        )
    return errors


def cp_errors(p: ParallelConfig, m: ModelConfig) -> list[str]:
    """The rules of context parallel: each sequence splits into 2 x cp equal chunks (rank i holds chunks i and
    2cp-1-i, so every rank's causal work is the same)."""
    if p.cp == 1:
        return []
    if m.seq_len % (2 * p.cp):
        return [
            f"model.seq_len({m.seq_len}) is not divisible by 2 * cp({p.cp}) = {2 * p.cp} load-balanced chunks; "
            f"choose cp with 2 * cp dividing {m.seq_len}"
        ]
    return []


def cp_chunks(seq_len: int, cp: int, rank: int) -> list[int]:
    """The sequence positions context-parallel rank `rank` of `cp` holds, in its order: chunk rank, then chunk
    2cp-1-rank, of 2 x cp equal chunks (torchtitan's and Megatron's load balance under the causal mask)."""
    size = seq_len // (2 * cp)
    return [*range(rank * size, (rank + 1) * size), *range((2 * cp - 1 - rank) * size, (2 * cp - rank) * size)]


def shard_errors(p: ParallelConfig, m: ModelConfig) -> list[str]:
    """The rules of sharded data parallel (FSDP2, and HSDP when parallel.dp_shard < dp)."""
    if p.dp_mode != "shard":
        return [f"parallel.dp_shard({p.dp_shard}) applies to dp_mode=shard; drop it"] if p.dp_shard else []
    dp, shard = p.dp, p.dp_shard or p.dp
    divisors = ", ".join(str(d) for d in range(2, dp + 1) if dp % d == 0)
    errors = []
    if dp == 1:
        errors.append("parallel.dp_mode=shard needs dp > 1 (it shards over the data-parallel ranks); use replicate")
    elif dp % shard:
        errors.append(f"parallel.dp_shard({shard}) does not divide dp({dp}); choose one of {divisors}")
    elif shard == 1:
        errors.append("parallel.dp_shard=1 shards nothing (every rank a replica); use dp_mode=replicate")
    if not p.overlap:
        errors.append(
            "parallel.overlap=false applies to dp_mode=replicate only: FSDP2 always overlaps its gathers and "
            "reduce-scatters with compute; drop it"
        )
    # FSDP splits each parameter's rows (after tensor parallel's split) over the shard group; with fewer rows
    # than ranks some ranks would hold padding only, and every gather would move mostly padding.
    kv_rows = linear_shapes(m, tp=p.tp)["attention.wk"][1]  # a weight's rows are its out features: (out, in)
    rows, name = min((m.dim, "the norms' weights (model.dim)"), (kv_rows, "wk and wv"))
    # Under context parallel FSDP shards over dp_shard x cp (parallel.mesh's dp_shard_cp): cp ranks hold one replica.
    group, cp = shard * p.cp, f" x cp({p.cp})" if p.cp > 1 else ""
    if group > rows:
        errors.append(
            f"sharding over {shard}{cp} ranks splits {name} into fewer rows ({rows}) than ranks; shard over fewer "
            f"ranks (HSDP: parallel.dp_shard dividing dp, at most {rows // p.cp}) or use a larger model"
        )
    return errors


@dataclass(frozen=True)
class ParallelDims(Record):
    """The validated layout of a world of ranks; also the `layout` a segment's summary records."""

    dp: int
    tp: int
    pp: int
    world_size: int
    cp: int = 1
    """parallel.cp: ranks that split every sequence (mesh dim between dp and tp)."""
    virtual_stages: int = 1
    schedule: str = "1f1b"
    microbatches: int = 1
    dp_mode: str = "replicate"
    dp_shard: int = 0
    """parallel.dp_shard: ranks one FSDP shard group spans under dp_mode=shard (0: all of dp)."""

    def __post_init__(self) -> None:
        if self.dp * self.cp * self.tp * self.pp != self.world_size:
            cp = f" * cp({self.cp})" if self.cp > 1 else ""
            raise ConfigError(
                f"dp({self.dp}){cp} * tp({self.tp}) * pp({self.pp}) = {self.dp * self.cp * self.tp * self.pp} "
                f"!= world_size({self.world_size}); change the layout or the number of ranks"
            )

    @classmethod
    def from_config(cls, p: ParallelConfig, m: ModelConfig, *, world_size: int, global_batch: int) -> ParallelDims:
        errors = parallel_errors(p, m, global_batch=global_batch)
        if errors:
            raise ConfigError("invalid parallel layout: " + "; ".join(errors))
        return cls(
            dp=p.dp,
            tp=p.tp,
            pp=p.pp,
            world_size=world_size,
            cp=p.cp,
            virtual_stages=p.virtual_stages,
            schedule=p.schedule,
            microbatches=p.microbatches,
            dp_mode=p.dp_mode,
            dp_shard=p.dp_shard,
        )

    def local_batch(self, global_batch: int) -> int:
        """Sequences per step on one data-parallel rank."""
        return global_batch // self.dp

    def microbatch_size(self, global_batch: int) -> int:
        """Sequences per microbatch (the pipeline's b): one data-parallel rank's batch over its microbatches."""
        return self.local_batch(global_batch) // self.microbatches

    @property
    def n_stages(self) -> int:
        return self.pp * self.virtual_stages

    @property
    def shard_size(self) -> int:
        """Ranks the state is sharded over: 1 when replicated, dp under FSDP, dp_shard under HSDP."""
        return (self.dp_shard or self.dp) if self.dp_mode == "shard" else 1

    @property
    def shard_ranks(self) -> int:
        """Ranks one FSDP shard group spans: shard_size x cp (the cp ranks share their dp rank's shard group:
        parallel.mesh's dp_cp / dp_shard_cp); 1 when replicated."""
        return self.shard_size * self.cp if self.fsdp_enabled else 1

    @property
    def pp_enabled(self) -> bool:
        """Pipeline parallel: the model's blocks split over more than one pipeline rank."""
        return self.pp > 1

    @property
    def fsdp_enabled(self) -> bool:
        """Sharded data parallel (FSDP2, or HSDP): parameters, gradients and optimizer state split over ranks."""
        return self.shard_size > 1

    @property
    def hsdp(self) -> bool:
        """Hybrid sharded data parallel: dp / shard_size replicas of groups that each shard shard_size ways."""
        return 1 < self.shard_size < self.dp
