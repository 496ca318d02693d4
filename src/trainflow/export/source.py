"""What an export reads, all of it untrusted: the checkpoint's manifest (its model), its tensors, the run's
token file (its tokenizer). Each check fails as one ExportError, ChecksumError or DataError line.
"""

from __future__ import annotations

import logging
import os
import warnings
from pathlib import Path

import h5py
import torch
import torch.distributed.checkpoint as dcp
from tokenizers import Tokenizer
from torch.distributed.checkpoint.api import CheckpointException
from torch.distributed.checkpoint.default_planner import DefaultLoadPlanner

from trainflow.checkpoint.folders import STEP, list_steps, step_dir
from trainflow.checkpoint.manifest import MANIFEST, MODEL_TYPES, ChecksumError, read_manifest
from trainflow.checkpoint.manifest import verify as verify_manifest
from trainflow.checkpoint.reader import InPlaceReader
from trainflow.checkpoint.state import FP8_STATE
from trainflow.config import ModelConfig, TrainflowError
from trainflow.config.run_folder import RunFolder
from trainflow.data.index import first_shard
from trainflow.data.record import DataError, check_size
from trainflow.hf.llama import parameter_shapes
from trainflow.records import RecordError

log = logging.getLogger(__name__)

OVERRIDES_FIX = "give the run's model overrides (e.g. model=tiny data.vocab_size=257)"


class ExportError(TrainflowError):
    """A checkpoint, configuration or output folder that cannot be exported."""


NO_FALLBACK = "the export takes no other checkpoint by itself: give it an earlier step-N/ of the series"
"""How a checkpoint that fails its checks ends its error here (training falls back to the previous one)."""


def find_checkpoint(path: Path) -> Path:
    """The checkpoint folder `path` names: itself (step-N/) or the newest of a series; absolute, so its
    series and run folder are its parents."""
    path = Path(os.path.abspath(path))
    if STEP.fullmatch(path.name) and path.is_dir():
        return path
    if steps := list_steps(path):
        return step_dir(path, steps[-1])
    raise ExportError(
        f"{path} is neither a checkpoint (step-N/) nor a folder of them; give <capacity>/checkpoints/<series> or "
        "one of its step-N folders"
    )


def choose_model(checkpoint: Path, given: ModelConfig | None) -> ModelConfig:
    """The model to export: the manifest's, which overrides `given` (None: none) must repeat; `given` where
    the manifest's is missing or unreadable."""
    try:
        recorded = read_manifest(checkpoint, fallback=NO_FALLBACK).recorded_model(checkpoint / MANIFEST)
    except RecordError as err:
        if given is None:
            raise ExportError(f"{err}: it was not written by this trainflow version; {OVERRIDES_FIX}") from None
        log.warning("Took the overrides' model, whose tensor shapes are checked: %s", err)
        return given
    if given is None or given == recorded:
        return recorded
    diff = next(k for k in MODEL_TYPES if getattr(given, k) != getattr(recorded, k))
    raise ExportError(
        f"the overrides give model.{diff}({getattr(given, diff)!r}) but {checkpoint / MANIFEST} records "
        f"{getattr(recorded, diff)!r}; drop the overrides (the manifest says which model the checkpoint holds)"
    )


def checked_shapes(checkpoint: Path, m: ModelConfig, *, fix: str) -> dict[str, tuple[int, ...]]:
    """The model tensors of a verified checkpoint (trainflow's names, model order) with their shapes, which must be
    those of the model `m`; `fix` ends the error of tensors that are not."""
    verify_manifest(checkpoint, fallback=NO_FALLBACK)
    saved = {
        k.removeprefix("model."): tuple(v.size)
        for k, v in InPlaceReader(checkpoint).read_metadata().state_dict_metadata.items()
        if k.startswith("model.") and not k.endswith(FP8_STATE)
    }
    # Listing the model's shapes takes time per layer: a forged model (a billion layers) must not get there.
    widest = max((max(size, default=1) for size in saved.values()), default=0)
    if m.n_layers > len(saved) or max(m.vocab_size, m.dim, m.ffn_dim) > widest:
        raise ExportError(
            f"{checkpoint} holds {len(saved)} model tensors, none wider than {widest}: too few or too narrow for "
            f"n_layers({m.n_layers}), vocab_size({m.vocab_size}), dim({m.dim}), ffn_dim({m.ffn_dim}); {fix}"
        )
    shapes = parameter_shapes(m)
    if odd := sorted(set(shapes) ^ set(saved)):
        side = "holds" if odd[0] in saved else "lacks"
        raise ExportError(
            f"{checkpoint} {side} the tensor model.{odd[0]}, unlike a model of {m.n_layers} layers; {fix}"
        )
    if wrong := next((k for k in shapes if shapes[k] != saved[k]), None):
        raise ExportError(
            f"{checkpoint} holds model.{wrong} of shape {saved[wrong]} where the model has {shapes[wrong]}; {fix}"
        )
    return shapes


def read_tensors(checkpoint: Path, shapes: dict[str, tuple[int, ...]]) -> dict[str, torch.Tensor]:
    """The full fp32 tensors `shapes` names (checked_shapes' names, a subset of them), read from the checkpoint:
    one process with no process group, so DCP reassembles tensor-parallel shards and gathers pipeline stages, and
    reads nothing else (the optimizer state, other tensors)."""
    state = {"model": {name: torch.empty(shape) for name, shape in shapes.items()}}
    try:
        with warnings.catch_warnings():  # DCP's notice that it loads in one process, which is the intent here
            warnings.filterwarnings("ignore", "torch.distributed is disabled", UserWarning)
            dcp.load(state, storage_reader=InPlaceReader(checkpoint), planner=DefaultLoadPlanner(), no_dist=True)
    except CheckpointException as err:
        _, (cause, _) = next(iter(err.failures.items()))
        raise ChecksumError(f"loading {checkpoint} failed: {' '.join(str(cause).split())}") from err
    return state["model"]


def read_model(checkpoint: Path, m: ModelConfig, *, fix: str) -> dict[str, torch.Tensor]:
    """The whole model of a verified checkpoint, keyed by trainflow's parameter names (the export streams it in
    shards instead)."""
    return read_tensors(checkpoint, checked_shapes(checkpoint, m, fix=fix))


def read_tokenizer(tokens: Path, m: ModelConfig) -> tuple[str, str, int]:
    """(tokenizer kind, its JSON, end-of-document id) recorded in a token file (data.tokens' attributes)."""
    rerun = "prepare_data (snakemake --forcerun prepare_data)"
    check_size(tokens, rerun=rerun)
    try:
        with h5py.File(tokens, "r") as f:
            kind, text, eot_id, vocab = (f.attrs[k] for k in ("tokenizer", "tokenizer_json", "eot_id", "vocab_size"))
    except (OSError, KeyError) as err:
        raise DataError(f"{tokens} lacks its tokenizer attributes or is no HDF5 file ({err}); rerun {rerun}") from err
    if kind == "bpe":
        try:
            Tokenizer.from_str(str(text))
        except Exception as err:  # tokenizers raises plain Exceptions
            raise DataError(f"{tokens} records a BPE tokenizer that does not parse ({err}); rerun {rerun}") from err
    if not 0 <= int(eot_id) < int(vocab) <= m.vocab_size:
        raise DataError(
            f"{tokens} records a tokenizer of {vocab} tokens (end of document {eot_id}) for a model of "
            f"{m.vocab_size}: it is not this run's token file; rerun {rerun}"
        )
    return str(kind), str(text), int(eot_id)


def run_tokens(series: Path) -> Path | None:
    """The first token shard of the run folder holding the checkpoint series `series` (config.run_folder's
    layout puts both on the capacity tier; every shard records the tokenizer); None where `series` lies in no
    run folder."""
    run = RunFolder(root="", capacity=str(series.parent.parent), fast="", series=series.name)
    return first_shard(run.tokens) if Path(run.checkpoints) == series else None
