"""Export a trainflow checkpoint as a Hugging Face LlamaForCausalLM folder.

    python -m trainflow.export CHECKPOINT OUT [OVERRIDE ...]
    python -m trainflow.export runs/default/capacity/checkpoints/<hash> hf/default

CHECKPOINT is one checkpoint (`.../checkpoints/<hash>/step-N/`) or a series (`.../checkpoints/<hash>/`, whose
newest checkpoint is taken), written by any layout. The model is the one its manifest records (the trainer
writes ModelConfig's fields there). The manifest is read as untrusted input: its CRCs cover the shards, not
itself, so its model must hold exactly ModelConfig's fields, each of its type, within the schema's domains
and model rules (config.checks), and the tensor shapes must be the ones that model has. OVERRIDEs are
optional: the run's Hydra overrides (e.g. model=tiny data.vocab_size=257), composed as train_segment composes
them. A checkpoint whose manifest records no model (trainflow before manifests held it) or one this version
cannot read needs them; otherwise they must describe the model the manifest records.

OUT gets config.json, model.safetensors (fp32, Hugging Face's parameter names) and, for a BPE run,
tokenizer.json and tokenizer_config.json from the token file in the checkpoint's run folder
(<capacity>/data/tokens.h5); a byte-tokenised run has no tokenizer file to export. Everything is written
into a temporary folder beside OUT and renamed into place, so a failure leaves OUT as it was. OUT must
be new or empty. The model's name is never part of a path.

Loading goes through the checkpoint's own guards: the manifest is verified (every file's CRC-32C)
before anything is read, `.metadata` is unpickled through trainflow's allow-list, tensors are read
with torch.load(weights_only=True) (checkpoint.reader). One process with no process group reads the
`model.*` tensors into full-size tensors: DCP reassembles tensor-parallel shards and gathers pipeline
stages; the optimizer state is never read. Trainflow's rotary embedding rotates halves (HF's
rotate_half), so q/k projections are copied as they are. The whole model is held in memory once.
"""

from __future__ import annotations

import argparse
import json
import logging
import logging.config
import os
import re
import reprlib
import shutil
import sys
import warnings
from pathlib import Path, PurePosixPath
from typing import get_type_hints

import h5py
import torch
import torch.distributed.checkpoint as dcp
import yaml
from safetensors import SafetensorError
from safetensors.torch import save_file
from tokenizers import Tokenizer
from torch.distributed.checkpoint.api import CheckpointException
from torch.distributed.checkpoint.default_planner import DefaultLoadPlanner

from trainflow.atomic import fsync_path
from trainflow.checkpoint.folders import STEP, list_steps, step_dir
from trainflow.checkpoint.manifest import MANIFEST, ChecksumError, read_manifest
from trainflow.checkpoint.manifest import verify as verify_manifest
from trainflow.checkpoint.reader import InPlaceReader
from trainflow.config import CONF_DIR, ModelConfig, TrainflowError, compose
from trainflow.config.checks import UNSAFE_PATH_CHARS, domain_errors, model_errors
from trainflow.config.run_folder import RunFolder
from trainflow.data.record import DataError, check_size
from trainflow.data.tokens import EOT_TEXT
from trainflow.model import Llama

log = logging.getLogger("trainflow.export")

# trainflow's module names -> Hugging Face's: inside each block, then outside the blocks.
BLOCK_NAMES = {
    "attention_norm": "input_layernorm",
    "attention.wq": "self_attn.q_proj",
    "attention.wk": "self_attn.k_proj",
    "attention.wv": "self_attn.v_proj",
    "attention.wo": "self_attn.o_proj",
    "ffn_norm": "post_attention_layernorm",
    "feed_forward.w1": "mlp.gate_proj",
    "feed_forward.w3": "mlp.up_proj",
    "feed_forward.w2": "mlp.down_proj",
}
TOP_NAMES = {"tok_embeddings": "model.embed_tokens", "norm": "model.norm", "output": "lm_head"}
MODEL_TYPES = get_type_hints(ModelConfig)  # field name -> int, float or str
OVERRIDES_FIX = "give the run's model overrides (e.g. model=tiny data.vocab_size=257)"


class ExportError(TrainflowError):
    """A checkpoint, configuration or output folder that cannot be exported."""


def hf_name(name: str) -> str:
    """A trainflow parameter name as LlamaForCausalLM names it: layers.3.attention.wq.weight ->
    model.layers.3.self_attn.q_proj.weight."""
    module = name.removesuffix(".weight")
    if block := re.fullmatch(r"layers\.(\d+)\.(.+)", module):
        return f"model.layers.{block[1]}.{BLOCK_NAMES[block[2]]}.weight"
    return f"{TOP_NAMES[module]}.weight"


def hf_config(m: ModelConfig, eot_id: int | None) -> dict:
    """config.json of LlamaForCausalLM for the model `m`; documents end (and, as GPT-2's do, start) with
    the end-of-document token `eot_id`, unknown (None) without the run's token file."""
    return {
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "vocab_size": m.vocab_size,
        "hidden_size": m.dim,
        "intermediate_size": m.ffn_dim,
        "num_hidden_layers": m.n_layers,
        "num_attention_heads": m.n_heads,
        "num_key_value_heads": m.n_kv_heads,
        "head_dim": m.head_dim,
        "hidden_act": "silu",
        "max_position_embeddings": m.seq_len,
        "rms_norm_eps": m.norm_eps,
        "rope_theta": m.rope_theta,
        "attention_bias": False,
        "mlp_bias": False,
        "tie_word_embeddings": False,
        "bos_token_id": eot_id,
        "eos_token_id": eot_id,
        "torch_dtype": "float32",
    }


def find_checkpoint(path: Path) -> Path:
    """The checkpoint folder `path` names: itself (step-N/) or the newest of a series; absolute, so its
    series and run folder are its parents."""
    path = Path(os.path.abspath(path))
    if STEP.fullmatch(path.name) and path.is_dir():
        return path
    if steps := list_steps(path):
        return step_dir(path, steps[-1])
    raise ExportError(
        f"{path} is neither a checkpoint (step-N/) nor a folder of them; give <capacity>/checkpoints/<hash> or "
        "one of its step-N folders"
    )


def check_out(out: Path, series: Path) -> None:
    """OUT is a path trainflow writes (the rules of config.checks.path_errors), new or empty, and outside
    the checkpoint series (a file there would make its checkpoints incomplete)."""
    if bad := re.search(UNSAFE_PATH_CHARS, str(out)):
        raise ExportError(f"OUT({str(out)!r}) holds {bad[0]!r}, which trainflow does not write to; rename it")
    if ".." in PurePosixPath(out).parts:
        raise ExportError(f"OUT({str(out)!r}) climbs out of its folder through '..'; give the path without '..'")
    if out.exists() and not out.is_dir():
        raise ExportError(f"OUT({out}) is a file; give a new or empty folder")
    if out.is_dir() and any(out.iterdir()):
        raise ExportError(f"OUT({out}) already holds files; give a new or empty folder (export overwrites nothing)")
    resolved, inside = out.resolve(), series.resolve()
    if resolved == inside or inside in resolved.parents:
        raise ExportError(
            f"OUT({out}) lies inside the checkpoint series {series}, whose checkpoints would then hold unlisted "
            "files; export elsewhere"
        )


def recorded_model(checkpoint: Path) -> ModelConfig:
    """The model the checkpoint's manifest records (CheckpointManager.save writes ModelConfig's fields), checked
    as a config is; ExportError names the first field that is missing, unknown, mistyped or out of its domain."""
    path, values = checkpoint / MANIFEST, read_manifest(checkpoint).get("model")
    if values is None:
        raise ExportError(f"{path} records no model")
    if not isinstance(values, dict):
        raise ExportError(f"{path} records the model as {reprlib.repr(values)}, not an object of ModelConfig's fields")
    if odd := sorted(set(values) ^ set(MODEL_TYPES)):
        why = "lacks ModelConfig's field" if odd[0] in MODEL_TYPES else "holds a field ModelConfig has not,"
        raise ExportError(f"{path}'s model {why} {reprlib.repr(odd[0])}")
    # bool is an int to isinstance; JSON's true is no layer count.
    if wrong := next((k for k, kind in MODEL_TYPES.items() if type(values[k]) is not kind), None):
        raise ExportError(
            f"{path} records model.{wrong}({reprlib.repr(values[wrong])}), which is no {MODEL_TYPES[wrong].__name__}"
        )
    m = ModelConfig(**values)
    if errors := domain_errors(m, "model.") or model_errors(m):  # the model rules assume the domains hold
        raise ExportError(f"{path} records a model outside the schema: {'; '.join(errors)}")
    return m


def choose_model(checkpoint: Path, given: ModelConfig | None) -> ModelConfig:
    """The model to export: the manifest's, which overrides `given` (None: none) must repeat; `given` where
    the manifest's is missing or unreadable."""
    try:
        recorded = recorded_model(checkpoint)
    except ExportError as err:
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


def read_model(checkpoint: Path, m: ModelConfig, *, fix: str) -> dict[str, torch.Tensor]:
    """The full fp32 model tensors of a verified checkpoint, keyed by trainflow's parameter names; `fix` ends
    the error of tensors that are not the model `m`."""
    verify_manifest(checkpoint)
    reader = InPlaceReader(checkpoint)
    saved = {
        k.removeprefix("model."): v.size
        for k, v in reader.read_metadata().state_dict_metadata.items()
        if k.startswith("model.")
    }
    # Building the meta model takes time per layer and fails past int64 sizes: a forged model must not get there.
    widest = max((max(size, default=1) for size in saved.values()), default=0)
    if m.n_layers > len(saved) or max(m.vocab_size, m.dim, m.ffn_dim) > widest:
        raise ExportError(
            f"{checkpoint} holds {len(saved)} model tensors, none wider than {widest}: too few or too narrow for "
            f"n_layers({m.n_layers}), vocab_size({m.vocab_size}), dim({m.dim}), ffn_dim({m.ffn_dim}); {fix}"
        )
    with torch.device("meta"):
        shapes = {name: p.shape for name, p in Llama(m).state_dict().items()}
    if odd := sorted(set(shapes) ^ set(saved)):
        side = "holds" if odd[0] in saved else "lacks"
        raise ExportError(
            f"{checkpoint} {side} the tensor model.{odd[0]}, unlike a model of {m.n_layers} layers; {fix}"
        )
    if wrong := next((k for k in shapes if tuple(shapes[k]) != tuple(saved[k])), None):
        raise ExportError(
            f"{checkpoint} holds model.{wrong} of shape {tuple(saved[wrong])} where the model has "
            f"{tuple(shapes[wrong])}; {fix}"
        )
    state = {"model": {name: torch.empty(shape) for name, shape in shapes.items()}}
    try:
        with warnings.catch_warnings():  # DCP's notice that it loads in one process, which is the intent here
            warnings.filterwarnings("ignore", "torch.distributed is disabled", UserWarning)
            # No process group: DCP's single-process path reads every chunk, whichever rank wrote it.
            dcp.load(state, storage_reader=reader, planner=DefaultLoadPlanner(), no_dist=True)
    except CheckpointException as err:
        _, (cause, _) = next(iter(err.failures.items()))
        raise ChecksumError(f"loading {checkpoint} failed: {' '.join(str(cause).split())}") from err
    return state["model"]


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
    """The token file of the run folder holding the checkpoint series `series` (config.run_folder's layout
    puts both on the capacity tier); None where `series` lies in no run folder."""
    run = RunFolder(root="", capacity=str(series.parent.parent), fast="", train_hash=series.name)
    return Path(run.tokens) if Path(run.checkpoints) == series else None


def write_folder(out: Path, files: dict[str, str], tensors: dict[str, torch.Tensor]) -> None:
    """Write `files` (name -> text) and model.safetensors into a temporary folder beside `out`, fsync
    them and rename the folder to `out`; a failure removes the temporary folder and is one ExportError."""
    tmp = out.parent / f".{out.name}.{os.getpid()}.tmp"
    try:
        out.parent.mkdir(parents=True, exist_ok=True)
        tmp.mkdir()
        for name, text in files.items():
            (tmp / name).write_text(text)
        save_file(tensors, tmp / "model.safetensors", metadata={"format": "pt"})
        umask = os.umask(0)
        os.umask(umask)
        (tmp / "model.safetensors").chmod(0o666 & ~umask)  # safetensors writes it through a private temporary file
        for path in tmp.iterdir():
            fsync_path(path)
        tmp.rename(out)  # replaces an empty folder
        fsync_path(out.parent)
    except (OSError, SafetensorError) as err:
        why = f"{err.strerror} ({err.filename})" if isinstance(err, OSError) else " ".join(str(err).split())
        raise ExportError(f"writing {out} failed: {why}; free space or fix permissions there and export again") from err
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def export(checkpoint: Path, out: Path, given: ModelConfig | None = None) -> Path:
    """Export the checkpoint `checkpoint` names to the folder `out`; the checkpoint exported. `given` is the
    model the run's overrides compose (None: take the manifest's, see choose_model)."""
    checkpoint = find_checkpoint(checkpoint)
    series = checkpoint.parent
    check_out(out, series)
    m = choose_model(checkpoint, given)
    altered = "its manifest records another model: the checkpoint was altered, export another one of the series"
    model = read_model(checkpoint, m, fix=altered if m is not given else OVERRIDES_FIX)
    tensors = {hf_name(name): t.contiguous() for name, t in model.items()}
    tokens, files, eot_id = run_tokens(series), {}, None
    if tokens is None or not tokens.is_file():
        log.warning(
            "Found no token file in the run folder of %s (<capacity>/data/tokens.h5): wrote no tokenizer and no "
            "eos_token_id",
            series,
        )
    else:
        kind, text, eot_id = read_tokenizer(tokens, m)
        if kind == "bpe":
            files["tokenizer.json"] = text
            tokenizer_config = {
                "tokenizer_class": "PreTrainedTokenizerFast",
                "bos_token": EOT_TEXT,
                "eos_token": EOT_TEXT,
                "model_max_length": m.seq_len,
            }
            files["tokenizer_config.json"] = json.dumps(tokenizer_config, indent=2) + "\n"
        else:
            log.info("Wrote no tokenizer file: %s was tokenised by %r, which has none", tokens, kind)
    files["config.json"] = json.dumps(hf_config(m, eot_id), indent=2) + "\n"
    write_folder(out, files, tensors)
    log.info(
        "Exported %s (%d tensors, %.1f MB) to %s: %s",
        checkpoint,
        len(tensors),
        sum(t.nbytes for t in tensors.values()) / 1e6,
        out,
        ", ".join(sorted([*files, "model.safetensors"])),
    )
    return checkpoint


def main(argv: list[str] | None = None) -> None:
    logging.config.dictConfig(yaml.safe_load((CONF_DIR / "hydra/job_logging/trainflow.yaml").read_text()))
    parser = argparse.ArgumentParser(prog="python -m trainflow.export", description=__doc__.splitlines()[0])
    parser.add_argument("checkpoint", type=Path, help="a checkpoint (step-N/) or a series of them")
    parser.add_argument("out", type=Path, help="the Hugging Face folder to write (new or empty)")
    parser.add_argument("overrides", nargs="*", help="the run's Hydra overrides, e.g. model=tiny (optional)")
    args = parser.parse_args(argv)
    try:
        given = compose("train_segment", args.overrides).model if args.overrides else None
        export(args.checkpoint, args.out, given)
    except TrainflowError as err:
        log.error("%s: %s", type(err).__name__, err)
        sys.exit(1)


if __name__ == "__main__":
    main()
