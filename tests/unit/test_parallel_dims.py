"""ParallelDims' names for what a layout turns on (pp_enabled, fsdp_enabled, hsdp), for every parallel preset, and
the FSDP rows rule's count of wk's rows, which config.shape gives."""

from __future__ import annotations

import pytest

from trainflow.config import CONF_DIR, ParallelDims, compose
from trainflow.config.layout import shard_errors

# preset -> (pp_enabled, fsdp_enabled, hsdp)
EXPECTED = {
    "single": (False, False, False),
    "dp2": (False, False, False),
    "tp2": (False, False, False),
    "dp2_tp2": (False, False, False),
    "pp2_1f1b": (True, False, False),
    "pp2_gpipe": (True, False, False),
    "pp2_interleaved": (True, False, False),
    "tp2_pp2": (True, False, False),
    "dp2_tp2_pp2": (True, False, False),
    "dp2_shard": (False, True, False),
    "dp2_shard_tp2": (False, True, False),
    "dp2_shard_pp2": (True, True, False),
    "dp2_shard_tp2_pp2": (True, True, False),
    "dp4_hsdp2": (False, True, True),
    "dp4_hsdp2_tp2": (False, True, True),
    "dp64_tp8_pp8": (True, False, False),
    "cp2": (False, False, False),
    "cp2_tp2": (False, False, False),
    "cp2_pp2": (True, False, False),
    "dp2_cp2": (False, False, False),
    "dp2_shard_cp2": (False, True, False),
    "dp4_cp16_tp8_pp8": (True, False, False),
}
EXPERIMENTS = {"dp64_tp8_pp8": "llama70b_alps", "dp4_cp16_tp8_pp8": "llama70b_alps_128k"}
"""The presets planned for the seed's cluster, composed with the experiment that sizes them."""


def test_every_parallel_preset_is_listed():
    assert sorted(EXPECTED) == sorted(p.stem for p in (CONF_DIR / "parallel").glob("*.yaml"))


@pytest.mark.parametrize("preset", EXPECTED)
def test_what_a_layout_turns_on(preset):
    extra = [f"experiment={EXPERIMENTS[preset]}"] if preset in EXPERIMENTS else []
    cfg = compose("train_segment", [f"parallel={preset}", *extra])
    p = cfg.parallel
    world = p.dp * p.cp * p.tp * p.pp
    dims = ParallelDims.from_config(p, cfg.model, world_size=world, global_batch=cfg.train.global_batch)
    assert (dims.pp_enabled, dims.fsdp_enabled, dims.hsdp) == EXPECTED[preset]


def test_fsdp_rows_of_wk_and_wv_are_the_shapes_out_features():
    """Four key/value heads of 8 wide at tp=2: wk's weight is (16, 64) on a tp rank, so 32 ranks cannot share it."""
    cfg = compose("train_segment", ["model.dim=64", "model.n_heads=8", "model.n_kv_heads=4"])
    p = cfg.parallel
    p.tp, p.dp, p.dp_mode, p.dp_shard = 2, 32, "shard", 32
    (line,) = shard_errors(p, cfg.model)
    assert line.startswith("sharding over 32 ranks splits wk and wv into fewer rows (16) than ranks")
