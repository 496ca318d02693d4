"""Every primary config and experiment composes; mistakes fail at compose time in one line."""

from __future__ import annotations

import dataclasses

import pytest
import yaml
from omegaconf import MISSING

from trainflow.config import CONF_DIR, STAGES, ConfigError, TrainflowConfig, compose, config_hash
from trainflow.config.layout import ParallelDims
from trainflow.config.rules import spike_warning
from trainflow.preflight import preflight

NO_FACTORY = dataclasses.MISSING

EXPERIMENTS = sorted(p.stem for p in (CONF_DIR / "experiment").glob("*.yaml"))
PARALLEL = sorted(p.stem for p in (CONF_DIR / "parallel").glob("*.yaml"))


@pytest.mark.parametrize("stage", STAGES)
def test_every_primary_config_composes(stage):
    cfg = compose(stage)
    assert cfg.stage == stage
    assert cfg.model.vocab_size == cfg.data.vocab_size


@pytest.mark.parametrize("experiment", EXPERIMENTS)
def test_every_experiment_composes(experiment):
    compose("train_segment", [f"experiment={experiment}"])


@pytest.mark.parametrize("layout", PARALLEL)
def test_every_parallel_preset_composes(layout):
    cfg = compose(
        "train_segment", [f"parallel={layout}"] + (["experiment=llama70b_alps"] if layout in ALPS_ONLY else [])
    )
    assert cfg.parallel.name == layout


def test_seed_70b_layout_is_planned_for_4096_gh200():
    cfg = compose("train_segment", ["experiment=llama70b_alps"])
    p, c = cfg.parallel, cfg.cluster
    assert (p.dp, p.tp, p.pp) == (64, 8, 8)
    assert p.world_size == 4096 == c.allocation.nodes * c.allocation.gpus_per_node
    assert c.runtime.env["NCCL_ALGO"] == "Tree" and c.runtime.collective_timeout_s == 300


def test_typo_fails_at_compose_time_in_one_line():
    with pytest.raises(ConfigError) as err:
        compose("train_segment", ["model.n_layr=2"])
    message = str(err.value)
    assert "\n" not in message
    assert "model.n_layr" in message and "ModelConfig" in message


def test_tp_not_dividing_heads_names_every_factor():
    with pytest.raises(ConfigError) as err:
        compose("train_segment", ["parallel.tp=3"])
    message = str(err.value)
    assert "\n" not in message
    assert "model.n_heads(4) is not divisible by tp(3)" in message


def test_wrong_type_and_unknown_option_are_one_line():
    for override, expected in (("model.n_layers=abc", "model.n_layers"), ("parallel=dp3", "choose one of")):
        with pytest.raises(ConfigError) as err:
            compose("train_segment", [override])
        assert expected in str(err.value) and "\n" not in str(err.value)


# (overrides, a fragment of the message): every layout rule of ParallelDims, refused before launch.
INVALID_LAYOUTS = [
    (["parallel.dp=0"], "parallel.dp(0) must be >= 1"),
    (["parallel.tp=3"], "model.n_heads(4) is not divisible by tp(3)"),
    (
        ["parallel.pp=3", "parallel.microbatches=4", "train.global_batch=12"],
        "model.n_layers(4) is not divisible by pp(3) * virtual_stages(1)",
    ),
    (
        ["parallel=pp2_interleaved", "parallel.virtual_stages=4"],
        "model.n_layers(4) is not divisible by pp(2) * virtual_stages(4) = 8",
    ),
    (["parallel=pp2_interleaved", "parallel.virtual_stages=1"], "interleaved_1f1b needs virtual_stages(1) >= 2"),
    (["parallel=pp2_1f1b", "parallel.virtual_stages=2"], "virtual_stages(2) > 1 needs schedule interleaved_1f1b"),
    (["parallel=pp2_1f1b", "parallel.microbatches=1"], "schedule 1f1b needs microbatches(1) >= pp(2)"),
    (["parallel=dp2", "train.global_batch=5"], "train.global_batch(5) is not divisible by dp(2) * microbatches(1)"),
    (["parallel=single", "parallel.microbatches=2"], "microbatches(2) > 1 needs pp > 1"),
    (["parallel.schedule=zero_bubble"], "parallel.schedule('zero_bubble') must be one of"),
    (["parallel=tp2", "model.multiple_of=1"], "the SwiGLU width 341"),
    (["parallel=tp2", "model.n_kv_heads=1"], "model.n_kv_heads(1) is not divisible by tp(2)"),
    (["model.n_kv_heads=3"], "model.n_kv_heads(3) does not divide model.n_heads(4)"),
    (["cluster.allocation.nodes=3"], "is not divisible by cluster.allocation.nodes(3)"),
    (["parallel=single", "parallel.dp_mode=shard"], "parallel.dp_mode=shard needs dp > 1"),
    (["parallel=dp2_shard", "parallel.overlap=false"], "parallel.overlap=false applies to dp_mode=replicate only"),
    (["parallel.dp_mode=zero2"], "parallel.dp_mode('zero2') must be one of replicate, shard"),
    (["parallel=dp4_hsdp2", "parallel.dp_shard=3", "train.global_batch=8"], "dp_shard(3) does not divide dp(4)"),
    (["parallel=dp4_hsdp2", "parallel.dp_shard=1", "train.global_batch=8"], "dp_shard=1 shards nothing"),
    (["parallel=dp2", "parallel.dp_shard=2"], "parallel.dp_shard(2) applies to dp_mode=shard"),
    (
        ["parallel=dp2_shard_tp2", "parallel.dp=64", "train.global_batch=64", "cluster.allocation.nodes=1"],
        "sharding over 64 ranks splits wk and wv into fewer rows (32) than ranks",
    ),
]


@pytest.mark.parametrize(("overrides", "fragment"), INVALID_LAYOUTS)
def test_invalid_layouts_are_refused_before_launch(overrides, fragment):
    with pytest.raises(ConfigError) as err:
        compose("train_segment", overrides)
    assert fragment in str(err.value)
    assert "\n" not in str(err.value)


def test_parallel_dims_checks_world_size():
    with pytest.raises(ConfigError, match=r"dp\(2\) \* tp\(2\) \* pp\(2\) = 8 != world_size\(4\)"):
        ParallelDims(dp=2, tp=2, pp=2, world_size=4)


def test_config_hash_covers_only_what_a_stage_reads():
    base = compose("train_segment")
    lr = compose("train_segment", ["optim.lr=1e-3"])
    assert config_hash(base, ("data",)) == config_hash(lr, ("data",))
    assert config_hash(base, ("optim",)) != config_hash(lr, ("optim",))


ALPS_ONLY = {"dp64_tp8_pp8", "dp4_cp16_tp8_pp8", "alps_gh200"}  # 4096 ranks: they compose only with the 70B campaign
GROUP_SCHEMAS = {f.name: f.default_factory for f in dataclasses.fields(TrainflowConfig) if (CONF_DIR / f.name).is_dir()}


def restated_defaults(schema: object, values: dict, prefix: str = "") -> list[str]:
    """The keys of a preset's `values` that repeat the schema's default (a sub-config's keys walked into)."""
    out = []
    for f in dataclasses.fields(schema):
        if f.name not in values:
            continue
        default = f.default_factory() if f.default_factory is not NO_FACTORY else f.default
        if dataclasses.is_dataclass(default):
            out += restated_defaults(default, values[f.name], f"{prefix}{f.name}.")
        elif default is not MISSING and values[f.name] == default:
            out.append(prefix + f.name)
    return out


@pytest.mark.parametrize("group", sorted(GROUP_SCHEMAS))
def test_each_default_lives_once_a_preset_value_or_a_schema_default(group):
    """A preset sets a key the schema gives a default only to change it (the knobs few presets change keep their
    default in the schema, beside their domain), and every preset composes on its own: a key without a default
    is set by every preset, directly or through its defaults list."""
    schema = GROUP_SCHEMAS[group]()
    for path in (CONF_DIR / group).glob("*.yaml"):
        values = {k: v for k, v in (yaml.safe_load(path.read_text()) or {}).items() if k != "defaults"}
        assert not (restated := restated_defaults(schema, values)), f"{path.name} restates schema defaults: {restated}"
        extra = ["experiment=llama70b_alps"] if path.stem in ALPS_ONLY else []
        compose("train_segment", [f"{group}={path.stem}", *extra])


def test_train_settings_that_cannot_work_are_refused_in_one_line(tmp_path, monkeypatch):
    a_file = tmp_path / "not-a-folder"
    a_file.write_text("")
    cases = [
        (["train.precision=fp16"], "train.precision('fp16') must be one of fp32, bf16 (fp16 needs loss scaling"),
        (["train.activations=swap"], "train.activations('swap') must be one of keep, recompute, offload"),
        (
            ["train.activations=offload", f"train.offload_dir={a_file}/acts"],
            f"train.offload_dir('{a_file}/acts') is not a folder ({a_file} is a file)",
        ),
        ([f"train.offload_dir={tmp_path}"], "is set but train.activations is keep; set train.activations=offload"),
        (["train.activations=offload", "train.offload_dir=/x/../etc"], "climbs out of its folder through '..'"),
    ]
    for overrides, fragment in cases:
        with pytest.raises(ConfigError) as err:
            preflight(compose("train_segment", overrides))
        assert fragment in str(err.value) and "\n" not in str(err.value), (overrides, str(err.value))
    monkeypatch.setenv("CXX", "no-such-compiler")
    with pytest.raises(ConfigError, match=r"train.compile=true needs a C\+\+ compiler .* apt install g\+\+"):
        preflight(compose("train_segment", ["train.compile=true"]))
    new = f"train.offload_dir={tmp_path}/new/acts"  # created when the first activation is offloaded
    preflight(compose("train_segment", ["train.activations=offload", new]))


def test_a_spike_window_the_run_cannot_fill_is_said_not_silent_but_a_test_run_is_not_told():
    assert spike_warning(compose("train_segment")) is None  # 2 x 150 steps, a window of 50
    # Issue 43, case 8: the smoke preset's 12 steps (a test run, under the default window) said it on every dry run
    assert spike_warning(compose("train_segment", ["experiment=smoke"])) is None
    run = ["experiment=smoke", "train.segment_steps=30"]
    line = spike_warning(compose("train_segment", [*run, "train.spike.window=60"]))
    assert line == (
        "train.spike.window(60) >= the run's 60 steps (train.segments(2) * segment_steps(30)): the spike guard judges "
        "no loss of this run (non-finite ones are still skipped); set train.spike.window below 60 for it to judge"
    )
    assert spike_warning(compose("train_segment", [*run, "train.spike.window=59"])) is None  # the fix, followed
