"""The seed's observed figures beside the plan, and which of them cannot hold together, computed from the config.

    python -m trainflow.plan experiment=llama70b_alps train.precision=bf16 train.activations=recompute

The seed (/work/shared/seed, section 3) observed on 4096 GH200, dp64 x tp8 x pp8: gradient all-reduce 35 %,
pipeline bubble 20 %, activation traffic 15 % of the step, and 580 tokens/s/GPU. Under the planner's
physics they do not all hold at once, for three reasons that `notes` states with this config's numbers:

- 580 tokens/s/GPU fixes the step (global_batch x seq_len / (580 x world)); if 70 % of it is all-reduce,
  bubble and activations, the model's FLOPs must run in the remaining 30 %, which needs the matmuls at
  ~94 % of the 989 TFLOP/s dense peak (no recomputation counted): far above what large GEMMs reach.
- A 20 % bubble means v m = 4 (p-1) = 28 chunk-microbatches; the layout's interleaved schedule with
  v = 5 and m = 16 idles (p-1)/(v m + p-1) = 8 %, its 1F1B 30 %.
- tp = 8 spans two 4-GPU nodes, so each block's tensor-parallel all-reduces cross Slingshot; the seed's
  split names no tensor-parallel share, and its "all-reduce" may include it.

The planner therefore does not reproduce 580 tokens/s for trainflow's own implementation of this layout:
its per-linear fp32 backward all-reduces across nodes and fp32 full-width stage exchanges (Megatron sends
bf16, split over tp) are what the plan shows costing most, and `remedies` what each change buys.
"""

from __future__ import annotations

from dataclasses import dataclass

from trainflow.config.schema import TrainflowConfig
from trainflow.energy.estimate import SEED_TABLE
from trainflow.plan.setup import PlanSetup
from trainflow.plan.step import StepPlan
from trainflow.records import Record

SEED_LAYOUT = (64, 8, 8)
"""dp, tp, pp of the seed's campaign."""
SEED_SHARES = {"all_reduce": 0.35, "bubble": 0.20, "activation": 0.15}
SEED_TOKENS_PER_S = SEED_TABLE[0][1]  # the baseline row of the seed's tuning table: 580
SEED_STEP_S = 31 * 60 / 250
"""The seed's Young/Daly example: a 31-minute interval is 250 iterations."""


def is_seed_layout(cfg: TrainflowConfig) -> bool:
    p = cfg.parallel
    return (p.dp, p.tp, p.pp) == SEED_LAYOUT


@dataclass(frozen=True)
class SeedComparison(Record):
    seed: dict[str, float]
    """The seed's shares of the step (all_reduce, bubble, activation) and its tokens/s/GPU."""
    plan: dict[str, float]
    """The plan's for the same parts (all_reduce_with_tp: its dp and tp shares together)."""
    notes: list[str]
    """Which of the seed's figures cannot hold together, and why, with this config's numbers."""


def seed_comparison(cfg: TrainflowConfig, setup: PlanSetup, step: StepPlan) -> SeedComparison:
    """The seed's figures, the plan's, and what the seed's figures imply under this config (module docstring)."""
    p, t, m = cfg.parallel, cfg.train, cfg.model
    shares = step.split.shares()
    step_at_seed = t.global_batch * m.seq_len / (SEED_TOKENS_PER_S * p.world_size)
    compute_share = 1 - sum(SEED_SHARES.values())
    tokens_per_device = t.global_batch * m.seq_len / p.world_size
    efficiency = (
        step.flops_per_token
        * tokens_per_device
        / (cfg.cluster.hardware.peak_tflops * 1e12 * compute_share * step_at_seed)
    )
    chunk_microbatches = (p.pp - 1) * (1 - SEED_SHARES["bubble"]) / SEED_SHARES["bubble"]
    one_f_one_b = (p.pp - 1) / (p.microbatches + p.pp - 1)
    per_node = setup.ranks_per_node
    notes = [
        f"580 tokens/s/GPU at global_batch {t.global_batch} x {m.seq_len} tokens on {p.world_size} devices is a "
        f"{step_at_seed:.2f} s step; the seed's 35 + 20 + 15 % leave {compute_share:.0%} of it for compute, which "
        f"needs matmuls at {efficiency:.0%} of peak_tflops (cluster.hardware.matmul_efficiency: "
        f"{cfg.cluster.hardware.matmul_efficiency})",
        f"a {SEED_SHARES['bubble']:.0%} bubble needs v*m = {chunk_microbatches:.0f}; this layout's "
        f"v={p.virtual_stages}, m={p.microbatches} gives {step.bubble_fraction:.1%}, "
        f"1F1B at m={p.microbatches} {one_f_one_b:.1%}",
        f"the seed's Young/Daly example (250 iterations in 31 min) is {SEED_STEP_S:.2f} s/step, "
        f"{SEED_STEP_S / step_at_seed:.1f}x the step 580 tokens/s implies at this batch",
    ]
    if p.tp > per_node:
        notes.append(
            f"tp={p.tp} spans {p.tp // per_node} nodes of {per_node} devices: the tp collectives (every block's and "
            f"the vocab ends') cross the network ({shares['tp']:.0%} of the planned step), a share the seed's split "
            "does not name"
        )
    return SeedComparison(
        seed={**SEED_SHARES, "tokens_per_s_per_device": SEED_TOKENS_PER_S},
        plan={
            "all_reduce": shares["dp"],
            "all_reduce_with_tp": shares["dp"] + shares["tp"],
            "bubble": shares["bubble"],
            "activation": shares["activation"],
            "tokens_per_s_per_device": step.tokens_per_s_per_device,
        },
        notes=notes,
    )
