"""Hugging Face's LlamaForCausalLM layout, both ways: export a trainflow checkpoint as such a folder (here), and
start a run from one (io.init_from: trainflow.checkpoint.hf_reader, which the trainer calls).

    python -m trainflow.export CHECKPOINT OUT [--max-shard-gb 5] [OVERRIDE ...]
    python -m trainflow.export runs/default/capacity/checkpoints/<series> hf/default

CHECKPOINT is one checkpoint (`.../checkpoints/<series>/step-N/`) or a series (`.../checkpoints/<series>/`, whose
newest checkpoint is taken), written by any layout. The model is the one its manifest records (the trainer
writes ModelConfig's fields there). The manifest is read as untrusted input: its CRCs cover the shards, not
itself, so its model must hold exactly ModelConfig's fields, each of its type, within the schema's domains
and model rules (config.checks), and the tensor shapes must be the ones that model has. OVERRIDEs are
optional: the run's Hydra overrides (e.g. model=tiny data.vocab_size=257), composed as train_segment composes
them. A checkpoint whose manifest records no model (trainflow before manifests held it) or one this version
cannot read needs them; otherwise they must describe the model the manifest records.

OUT gets config.json, the fp32 weights under Hugging Face's names (hf.llama) as model.safetensors or, past
--max-shard-gb, as shards with their index (hf.write) and, for a BPE run, tokenizer.json and
tokenizer_config.json from the token file in the checkpoint's run folder (<capacity>/data/tokens/shard-00000.h5); a
byte-tokenised run has no tokenizer file to export. Everything is written into a temporary folder beside OUT and
renamed into place, so a failure leaves OUT as it was. OUT must be new or empty. The model's name is never part of
a path.

Loading goes through the checkpoint's own guards: the manifest is verified (every file's CRC-32C)
before anything is read, `.metadata` is unpickled through trainflow's allow-list, tensors are read
with torch.load(weights_only=True) (checkpoint.reader). One process with no process group reads each shard's
`model.*` tensors into full-size tensors just before writing it: DCP reassembles tensor-parallel shards and gathers
pipeline stages; the optimizer state is never read, and one shard's tensors are held in memory at a time.
Trainflow's rotary embedding rotates halves (HF's rotate_half), so q/k projections are copied as they are.
"""

from __future__ import annotations

import json
import logging
from pathlib import Path

from trainflow.config import ModelConfig
from trainflow.data.tokenizer import EOT_TEXT
from trainflow.export.out import check_out
from trainflow.export.source import (
    OVERRIDES_FIX,
    ExportError,
    checked_shapes,
    choose_model,
    find_checkpoint,
    read_model,
    read_tensors,
    read_tokenizer,
    run_tokens,
)
from trainflow.hf.llama import folder_shapes, hf_config, hf_name
from trainflow.hf.write import MAX_SHARD_BYTES, plan_shards, shard_names, write_folder

__all__ = ["ExportError", "choose_model", "export", "read_model"]

log = logging.getLogger(__name__)


def export(
    checkpoint: Path, out: Path, given: ModelConfig | None = None, *, max_shard_bytes: int = MAX_SHARD_BYTES
) -> Path:
    """Export the checkpoint `checkpoint` names to the folder `out`; the checkpoint exported. `given` is the
    model the run's overrides compose (None: take the manifest's, see choose_model)."""
    checkpoint = find_checkpoint(checkpoint)
    series = checkpoint.parent
    check_out(out, series)
    m = choose_model(checkpoint, given)
    altered = "its manifest records another model: the checkpoint was altered, export another one of the series"
    shapes = checked_shapes(checkpoint, m, fix=altered if m is not given else OVERRIDES_FIX)
    shapes = {k: shapes[k] for k in folder_shapes(m)}  # a tied head is the embedding: no lm_head.weight
    files = tokenizer_files(series, m)
    files["config.json"] = json.dumps(hf_config(m, files.pop("eot_id", None)), indent=2) + "\n"
    shards = plan_shards(shapes, max_shard_bytes)

    def read(names: list[str]) -> dict:
        return {hf_name(k): t.contiguous() for k, t in read_tensors(checkpoint, {k: shapes[k] for k in names}).items()}

    nbytes = write_folder(out, files, shards, read)
    log.info(
        "Exported %s (%d tensors, %.1f MB in %d safetensors file%s) to %s: %s",
        checkpoint,
        len(shapes),
        nbytes / 1e6,
        len(shards),
        "s" if len(shards) > 1 else "",
        out,
        ", ".join(sorted([*files, *shard_names(len(shards))])),
    )
    return checkpoint


def tokenizer_files(series: Path, m: ModelConfig) -> dict:
    """The tokenizer's files of a BPE run (tokenizer.json, tokenizer_config.json) from its token file, and under
    "eot_id" its end-of-document id (none without the run's token file)."""
    tokens, files = run_tokens(series), {}
    if tokens is None or not tokens.is_file():
        log.warning(
            "Found no token shard in the run folder of %s (<capacity>/data/tokens/shard-00000.h5): wrote no "
            "tokenizer and no eos_token_id",
            series,
        )
        return files
    kind, text, files["eot_id"] = read_tokenizer(tokens, m)
    if kind != "bpe":
        log.info("Wrote no tokenizer file: %s was tokenised by %r, which has none", tokens, kind)
        return files
    files["tokenizer.json"] = text
    tokenizer_config = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "bos_token": EOT_TEXT,
        "eos_token": EOT_TEXT,
        "model_max_length": m.seq_len,
    }
    files["tokenizer_config.json"] = json.dumps(tokenizer_config, indent=2) + "\n"
    return files
