"""Checks of a composed config: every field's domain, paths, rank environment, cross-field rules.

    python -c "from trainflow.config import compose; compose('train_segment', ['optim.lr=-1'])"

`validate` raises one ConfigError whose message names every offending value and the fix.
"""

from __future__ import annotations

import os
import re
import shutil
from dataclasses import fields, is_dataclass
from pathlib import Path, PurePosixPath
from typing import Any

from trainflow.config.layout import parallel_errors
from trainflow.config.schema import (
    BYTE_VOCAB,
    GATE_PATTERNS,
    VERSION_COMPONENTS,
    ClusterConfig,
    DataConfig,
    EnergyConfig,
    ModelConfig,
    TrainflowConfig,
)
from trainflow.config.shape import linear_shapes
from trainflow.errors import ConfigError


def validate(cfg: TrainflowConfig) -> None:
    """Cross-field checks; raises one ConfigError listing every violation with its fix."""
    p, m, t = cfg.parallel, cfg.model, cfg.train
    errors = domain_errors(cfg) + path_errors(cfg) + env_errors(cfg.cluster.env) + gate_errors(cfg.cluster)
    if errors:  # the cross-field rules below assume every field lies in its domain
        raise ConfigError("invalid config: " + "; ".join(errors))
    errors = (
        parallel_errors(p, m, global_batch=t.global_batch)
        + model_errors(m)
        + train_errors(cfg)
        + energy_errors(cfg.energy)
        + data_errors(cfg.data)
    )
    if cfg.data.tokenizer == "byte" and cfg.data.vocab_size != BYTE_VOCAB:
        errors.append(f"data.vocab_size({cfg.data.vocab_size}) must be {BYTE_VOCAB} with the byte tokenizer")
    if m.vocab_size < cfg.data.vocab_size:
        errors.append(
            f"model.vocab_size({m.vocab_size}) < data.vocab_size({cfg.data.vocab_size}): the tokenizer's ids "
            "would overflow the embedding; use a model with at least data.vocab_size rows"
        )
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


def data_errors(d: DataConfig) -> list[str]:
    """A pretrained tokenizer must parse, and its vocabulary be data.vocab_size (which the model's must hold)."""
    if d.tokenizer != "pretrained":
        return []
    from tokenizers import Tokenizer  # only here: composing any other config does not load it

    try:
        size = Tokenizer.from_file(d.tokenizer_path).get_vocab_size(with_added_tokens=True)
    except Exception as err:  # tokenizers raises plain Exceptions
        reason = str(err).replace("\n", " ")
        return [f"data.tokenizer_path({d.tokenizer_path!r}) is no readable tokenizer.json ({reason}); give one"]
    if size != d.vocab_size:
        return [f"data.vocab_size({d.vocab_size}) must be {size}, the size of data.tokenizer_path's vocabulary"]
    return []


def gate_errors(c: ClusterConfig) -> list[str]:
    """validate_nccl's tables name known patterns and components, with sane values."""
    errors = [
        f"cluster.gate_busbw_gbps has {name!r}, no pattern: use {', '.join(GATE_PATTERNS)}"
        for name in c.gate_busbw_gbps
        if name not in GATE_PATTERNS
    ]
    errors += [
        f"cluster.gate_busbw_gbps.{name}({gbps}) must be a number >= 0"
        for name, gbps in c.gate_busbw_gbps.items()
        if not (isinstance(gbps, int | float) and gbps >= 0)
    ]
    errors += [
        f"cluster.versions_allowed has {name!r}, which validate_nccl does not read: use {', '.join(VERSION_COMPONENTS)}"
        for name in c.versions_allowed
        if name not in VERSION_COMPONENTS
    ]
    return errors


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


def energy_errors(e: EnergyConfig) -> list[str]:
    if e.idle_clock_mhz > e.compute_clock_mhz:
        return [
            f"energy.idle_clock_mhz({e.idle_clock_mhz}) > energy.compute_clock_mhz({e.compute_clock_mhz}): DVFS lowers "
            f"clocks while data loads; choose an idle clock in 1-{e.compute_clock_mhz} MHz"
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
    return errors


def train_errors(cfg: TrainflowConfig) -> list[str]:
    """Precision, activation memory and compile settings that cannot work where the run will go."""
    t, errors = cfg.train, []
    if t.offload_dir and t.activations != "offload":
        errors.append(
            f"train.offload_dir({t.offload_dir!r}) is set but train.activations is {t.activations}; "
            "set train.activations=offload or leave offload_dir empty"
        )
    elif t.offload_dir and (why := unwritable(t.offload_dir)):
        errors.append(f"train.offload_dir({t.offload_dir!r}) {why}; give a writable folder on the fast tier")
    if t.compile and cfg.cluster.device == "cpu" and (why := missing_compiler()):
        errors.append(f"train.compile=true {why}")
    if t.fp8 != "none":
        errors += fp8_errors(cfg)
    return errors


FP8_TILE = 16  # fp8 tensor-core GEMMs (cuBLASLt's, and full tiles of kernels/) take features in multiples of 16


def fp8_errors(cfg: TrainflowConfig) -> list[str]:
    """FP8 runs inside bf16 training, on tensor-core tiles of 16, on whole (not tensor-parallel) linears."""
    t, m, errors = cfg.train, cfg.model, []
    if t.precision != "bf16":
        errors.append(
            f"train.fp8={t.fp8} runs inside bf16 training (its GEMMs output bf16) and train.precision is "
            f"{t.precision}; set train.precision=bf16"
        )
    if cfg.parallel.tp > 1:
        errors.append(
            f"train.fp8={t.fp8} with parallel.tp({cfg.parallel.tp}) > 1 is not supported: each shard's scale "
            "would have to be agreed over the tp group; use dp / pp for this model or train.fp8=none"
        )
    bad = [
        f"layers.*.{name} is a {d_in} -> {d_out} Linear"
        for name, (d_in, d_out) in linear_shapes(m, tp=cfg.parallel.tp).items()
        if d_in % FP8_TILE or d_out % FP8_TILE
    ]
    if bad:
        errors.append(
            f"train.fp8: {bad[0]}{f' (and {len(bad) - 1} more)' if len(bad) > 1 else ''}; fp8 GEMMs need in and "
            f"out features in multiples of {FP8_TILE} (tensor-core tiles): make model.dim, its head dim "
            "(dim / n_heads) and model.multiple_of multiples of 16, or set train.fp8=none"
        )
    return errors


def unwritable(folder: str) -> str | None:
    """Why activations cannot be written under `folder` (None: they can); it is created if missing."""
    path = Path(folder)
    existing = next(p for p in (path, *path.parents) if p.exists())
    if not existing.is_dir():
        return f"is not a folder ({existing} is a file)"
    if not os.access(existing, os.W_OK | os.X_OK):
        return f"is not writable ({existing} refuses writes)"
    return None


def missing_compiler() -> str | None:
    """Why inductor cannot build CPU kernels here (None: it can): it compiles C++ with $CXX or g++."""
    cxx = os.environ.get("CXX", "g++")
    if shutil.which(cxx) is None:
        return f"needs a C++ compiler for inductor's CPU kernels and {cxx} is not on PATH: apt install g++ (or set CXX)"
    return None


def path_errors(cfg: TrainflowConfig) -> list[str]:
    """Storage and io paths, in order: none of UNSAFE_PATH_CHARS and no '..' (normalised, such a path
    can climb out of the folder it is declared in)."""
    paths = [
        (f"{section}.{f.name}", getattr(node, f.name))
        for section, node in (("storage", cfg.storage), ("io", cfg.io))
        for f in fields(node)
    ] + [("train.offload_dir", cfg.train.offload_dir)]
    for key, value in paths:
        for path in value if isinstance(value, list) else [value]:
            if why := unsafe_path(key, path):
                return [why]
    return []  # one error at most: the paths derive from each other, so the first names the cause


def unsafe_path(key: str, path: str) -> str | None:
    """Why trainflow refuses to read or write `path` (None: it does not): UNSAFE_PATH_CHARS or '..'."""
    if bad := re.search(UNSAFE_PATH_CHARS, path):
        return f"{key}({path!r}) holds {bad[0]!r}, which trainflow does not pass to a shell or Hydra; rename it"
    if ".." in PurePosixPath(path).parts:
        return f"{key}({path!r}) climbs out of its folder through '..'; give the path without '..'"
    return None


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
                f"cluster.env.{name} is not a variable trainflow passes to ranks: only NCCL_*, TORCH_*, CUDA_*, "
                "FI_*, UCX_*, GLOO_*, OMP_*, MKL_*, MPICH_*, NVSHMEM_*, CXI_* (none that loads a plugin or names a "
                "file to write)"
            )
        elif re.search(r"[\x00-\x1f\x7f]", str(value)):
            errors.append(f"cluster.env.{name}({value!r}) holds a control character; give a one-line value")
    return errors
