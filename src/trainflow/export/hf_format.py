"""What an export writes: Hugging Face's LlamaForCausalLM names and config.json, and the folder they go to,
all or nothing.
"""

from __future__ import annotations

import os
import re
import shutil
from pathlib import Path

import torch
from safetensors import SafetensorError
from safetensors.torch import save_file

from trainflow.atomic import fsync_path
from trainflow.config import ModelConfig
from trainflow.config.security import unsafe_path
from trainflow.export.source import ExportError

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


def check_out(out: Path, series: Path) -> None:
    """OUT is a path trainflow writes (the rules of config.security.path_errors), new or empty, and outside
    the checkpoint series (a file there would make its checkpoints incomplete)."""
    if why := unsafe_path("OUT", str(out)):
        raise ExportError(why)
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
