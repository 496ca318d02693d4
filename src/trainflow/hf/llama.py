"""Hugging Face's LlamaForCausalLM layout, without torch: its parameter names and config.json for a trainflow model
(what trainflow.export writes), and config.json read back against the model a run configures (io.init_from).

    python -c "from pathlib import Path; from trainflow.config import compose; from trainflow.hf.llama import \
        check_config; check_config(Path('hf/Meta-Llama-3-8B'), compose('train_segment', ['model=llama3_8b']).model)"

The folder's files are untrusted: config.json is parsed as JSON and compared field by field, each mismatch named
with the override (or the preset) that would match; the weights' checks are hf.weights'. Both are pre-flight
checks (trainflow.preflight), so a folder that cannot start the run fails when the DAG is built, before any stage
runs, and again when the trainer reads it (the files may change in between). Rotary embeddings: trainflow rotates
halves, as HF's rotate_half, so q/k projections need no permutation. Llama 3.1's frequency scaling (rope_type llama3,
in rope_scaling or transformers 5's rope_parameters) is model.rope_scaling=llama3 and its four parameters; any other
scaling, in either spelling of its kind (rope_type, or type before transformers 4.43), is refused. A head tied to the
embedding (tie_word_embeddings, Llama 3.2) is model.tie_embeddings: its folder has no lm_head.weight.
"""

from __future__ import annotations

import dataclasses
import json
import math
import re
from dataclasses import fields
from pathlib import Path

import yaml
from omegaconf import MISSING

from trainflow.config.compose import CONF_DIR
from trainflow.config.schema import ModelConfig
from trainflow.config.shape import linear_shapes
from trainflow.errors import TrainflowError

CONFIG = "config.json"

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
ROPE_KEYS = {
    "rope_factor": "factor",
    "rope_low_freq_factor": "low_freq_factor",
    "rope_high_freq_factor": "high_freq_factor",
    "rope_original_seq_len": "original_max_position_embeddings",
}
"""ModelConfig's llama3 rotary fields -> their keys in config.json's rope_scaling (transformers 5: rope_parameters)."""

FIELDS = {
    "vocab_size": "vocab_size",
    "dim": "hidden_size",
    "n_layers": "num_hidden_layers",
    "n_heads": "num_attention_heads",
    "n_kv_heads": "num_key_value_heads",
    "ffn_dim": "intermediate_size",
    "norm_eps": "rms_norm_eps",
    "rope_theta": "rope_theta",
}
"""ModelConfig's field (or property: ffn_dim) -> the config.json key that must equal it. seq_len is free:
continued pre-training may train shorter or longer windows than max_position_embeddings."""
SCALING_KEYS = {
    "rope_scaling": "rope_scaling",
    **{field: f"rope_scaling.{key}" for field, key in ROPE_KEYS.items()},
    "tie_embeddings": "tie_word_embeddings",
}
"""ModelConfig's fields scaling_values reads from config.json -> the key an error names."""


class HfFolderError(TrainflowError):
    """A Hugging Face folder (io.init_from) that cannot initialise the configured model."""


def hf_name(name: str, *, tied: bool = False) -> str:
    """A trainflow parameter name as LlamaForCausalLM names it: layers.3.attention.wq.weight ->
    model.layers.3.self_attn.q_proj.weight; a `tied` head's (output.weight) is the embedding's, which a tied
    folder holds alone (it has no lm_head.weight)."""
    module = name.removesuffix(".weight")
    if block := re.fullmatch(r"layers\.(\d+)\.(.+)", module):
        return f"model.layers.{block[1]}.{BLOCK_NAMES[block[2]]}.weight"
    return f"{TOP_NAMES['tok_embeddings' if tied and module == 'output' else module]}.weight"


def parameter_shapes(m: ModelConfig) -> dict[str, tuple[int, ...]]:
    """Every parameter of the model, by trainflow name, with its shape (what trainflow.model builds)."""
    block = {f"{name}.weight": (d_out, d_in) for name, (d_in, d_out) in linear_shapes(m).items()}
    block |= {"attention_norm.weight": (m.dim,), "ffn_norm.weight": (m.dim,)}
    shapes = {f"layers.{i}.{name}": shape for i in range(m.n_layers) for name, shape in block.items()}
    return {
        "tok_embeddings.weight": (m.vocab_size, m.dim),
        **shapes,
        "norm.weight": (m.dim,),
        **{"output.weight": (m.vocab_size, m.dim)},
    }


def folder_shapes(m: ModelConfig) -> dict[str, tuple[int, ...]]:
    """The tensors of a Hugging Face folder of the model `m`, by trainflow name: every parameter, but a tied head
    (model.tie_embeddings), whose weight is the embedding's."""
    return {k: v for k, v in parameter_shapes(m).items() if not (m.tie_embeddings and k == "output.weight")}


def rope_scaling(m: ModelConfig) -> dict:
    """config.json's rope_scaling of the model `m` as transformers 4.43+ writes Llama 3.1's ({} without scaling)."""
    if m.rope_scaling == "none":
        return {}
    return {"rope_scaling": {"rope_type": m.rope_scaling, **{key: getattr(m, f) for f, key in ROPE_KEYS.items()}}}


def hf_config(m: ModelConfig, eot_id: int | None) -> dict:
    """config.json of LlamaForCausalLM for the model `m`; documents end (and, as GPT-2's do, start) with
    the end-of-document token `eot_id`, unknown (None) without the run's token file."""
    return {
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        **{key: getattr(m, field) for field, key in FIELDS.items()},
        "head_dim": m.head_dim,
        "hidden_act": "silu",
        "max_position_embeddings": m.seq_len,
        "attention_bias": False,
        "mlp_bias": False,
        "tie_word_embeddings": m.tie_embeddings,
        **rope_scaling(m),
        "bos_token_id": eot_id,
        "eos_token_id": eot_id,
        "torch_dtype": "float32",
    }


def read_config(folder: Path) -> dict:
    """The folder's config.json as a JSON object; HfFolderError if it is missing or malformed."""
    path = folder / CONFIG
    if not folder.is_dir():
        raise HfFolderError(
            f"io.init_from({folder}) is no folder; give a Hugging Face model folder ({CONFIG} + weights)"
        )
    try:
        values = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise HfFolderError(
            f"io.init_from({folder}) has no {CONFIG}; give the folder of a Hugging Face model (its config.json and "
            "*.safetensors, e.g. from huggingface-cli download)"
        ) from None
    except (OSError, UnicodeDecodeError, ValueError, RecursionError) as err:  # RecursionError: nested too deep
        raise HfFolderError(f"{path} is no readable JSON ({' '.join(str(err).split())}); download it again") from err
    if not isinstance(values, dict):
        raise HfFolderError(
            f"{path} holds a JSON {type(values).__name__}, not an object of settings; download it again"
        )
    return values


def rope_settings(c: dict) -> object:
    """config.json's rotary settings: transformers 5's rope_parameters, else rope_scaling (absent: {})."""
    rope = c.get("rope_parameters")
    return (c.get("rope_scaling") if rope is None else rope) or {}


def rope_kind(rope: dict) -> object:
    """The scaling's kind in either spelling: rope_type (transformers 4.43+), type (before 4.43)."""
    return rope.get("rope_type", rope.get("type", "default"))


def unsupported(path: Path, c: dict) -> str | None:
    """What in config.json trainflow's Llama cannot compute (None: nothing)."""
    rope = rope_settings(c)
    checks = [
        (c.get("model_type") == "llama", f"model_type {c.get('model_type')!r}, not 'llama'"),
        (c.get("hidden_act", "silu") == "silu", f"hidden_act {c.get('hidden_act')!r}, not SwiGLU's 'silu'"),
        (not c.get("attention_bias") and not c.get("mlp_bias"), "biases in attention or the MLP"),
        (isinstance(rope, dict), f"rope_scaling {rope!r}, which is no object of rotary settings"),
        (
            not isinstance(rope, dict) or rope_kind(rope) in ("default", "llama3"),
            f"rotary scaling {rope_kind(rope) if isinstance(rope, dict) else rope!r} (of its rotary settings "
            "trainflow computes none and Llama 3.1's llama3)",
        ),
    ]
    why = next((text for ok, text in checks if not ok), None)
    return f"{path} describes {why}, which trainflow's Llama does not compute; import another model" if why else None


def disagreement(path: Path, c: dict) -> str | None:
    """Where config.json gives a rotary setting twice and the two differ (None: it does not): transformers 5's
    rope_parameters beside a rope_scaling object (which transformers 5.25 reads instead), or rope_theta at the top
    beside rope_parameters' (which it reads instead). Either reading starts the run from another function than the
    folder's other reader would."""
    params, scaling = c.get("rope_parameters"), c.get("rope_scaling")
    if not isinstance(params, dict):
        return None
    pairs = []  # (the setting, where the first is, its value, where the second is, its value)
    if c.get("rope_theta") is not None and "rope_theta" in params:
        pairs.append(("rope_theta", "at the top", c["rope_theta"], "in rope_parameters", params["rope_theta"]))
    if isinstance(scaling, dict):
        inside = ("in rope_parameters", "in rope_scaling")
        pairs.append(("the rotary scaling", inside[0], rope_kind(params), inside[1], rope_kind(scaling)))
        pairs += [(key, inside[0], params.get(key), inside[1], scaling.get(key)) for key in ROPE_KEYS.values()]
    for key, first, one, second, other in pairs:
        if one != other:
            return (
                f"{path} gives {key} twice and they differ: {one!r} {first}, {other!r} {second} (trainflow and "
                "transformers would each read another, and start from another function); delete the wrong one from "
                "config.json"
            )
    return None


def scaling_values(path: Path, c: dict) -> dict[str, str | int | float | bool]:
    """config.json's rotary scaling and head tying as ModelConfig's fields (unsupported refused the rest): the
    llama3 parameters only where it scales, each of its JSON type."""
    rope, tied = rope_settings(c), c.get("tie_word_embeddings", False)
    if type(tied) is not bool:
        raise HfFolderError(f"{path} gives tie_word_embeddings as {tied!r}, not true or false; download it again")
    if rope_kind(rope) != "llama3":
        return {"rope_scaling": "none", "tie_embeddings": tied}
    out: dict[str, str | int | float | bool] = {"rope_scaling": "llama3", "tie_embeddings": tied}
    for field, key in ROPE_KEYS.items():
        kind, value = (int if field == "rope_original_seq_len" else float), rope.get(key)
        if type(value) is not kind and not (kind is float and type(value) is int):  # bool is an int to isinstance
            raise HfFolderError(
                f"{path} gives rope_scaling.{key} as {value!r}, not a {kind.__name__}; download it again"
            )
        out[field] = finite(path, f"rope_scaling.{key}", value)
    return out


def finite(path: Path, key: str, value: int | float) -> int | float:
    """`value` where it is a finite number (JSON's NaN and Infinity parse, and no model computes with them)."""
    if not math.isfinite(value):
        raise HfFolderError(
            f"{path} gives {key} as {value!r}, which no model computes with; write the model's value into config.json "
            "(its model card's: Llama 3.1's rope_scaling.factor is 8.0, Llama 3.2's 32.0), or download it again"
        )
    return value


def config_values(path: Path, c: dict) -> dict[str, int | float]:
    """config.json's values of FIELDS, each of its JSON type (rope_theta also from transformers 5's
    rope_parameters; num_key_value_heads defaults to the heads, as in Llama 2 7B)."""
    rope = c.get("rope_parameters") if isinstance(c.get("rope_parameters"), dict) else {}
    values = {
        **c,
        "rope_theta": c.get("rope_theta", rope.get("rope_theta")),
        "num_key_value_heads": c.get("num_key_value_heads", c.get("num_attention_heads")),
    }
    out = {}
    for field, key in FIELDS.items():
        kind = float if field in ("norm_eps", "rope_theta") else int
        value = values.get(key)
        if type(value) is not kind and not (kind is float and type(value) is int):  # bool is an int to isinstance
            raise HfFolderError(f"{path} gives {key} as {value!r}, not a {kind.__name__}; download it again")
        out[field] = finite(path, key, value)
    heads = out["n_heads"]
    if heads < 1 or c.get("head_dim", out["dim"] // heads) * heads != out["dim"]:
        raise HfFolderError(
            f"{path} gives head_dim {c.get('head_dim')} with {heads} heads of hidden_size "
            f"{out['dim']}; trainflow's heads are hidden_size / num_attention_heads wide"
        )
    return out


def check_config(folder: Path, m: ModelConfig) -> None:
    """config.json must describe the model `m`: one HfFolderError naming every mismatched field and the preset or
    overrides that would match."""
    path = folder / CONFIG
    c = read_config(folder)
    if why := unsupported(path, c) or disagreement(path, c):
        raise HfFolderError(why)
    want = config_values(path, c) | scaling_values(path, c)
    keys = FIELDS | SCALING_KEYS
    wrong = [f for f in want if getattr(m, f) != want[f]]
    if not wrong:
        return
    diff = ", ".join(f"model.{f}({getattr(m, f)}) but {keys[f]} {want[f]}" for f in wrong)
    raise HfFolderError(f"{path} describes another model: {diff}; {matching(want, m)}")


def matching(want: dict, m: ModelConfig) -> str:
    """The preset that gives config.json's model, else the overrides that do (ffn_dim through multiple_of)."""
    defaults = {f.name: f.default for f in fields(ModelConfig) if f.default not in (MISSING, dataclasses.MISSING)}
    for preset in sorted((CONF_DIR / "model").glob("*.yaml")):
        values = {k: v for k, v in yaml.safe_load(preset.read_text()).items() if not str(v).startswith("${")}
        candidate = ModelConfig(**{**vars(m), **defaults, **values})  # what the preset leaves out is the schema's
        if all(getattr(candidate, f) == want[f] for f in want):
            return f"model={preset.stem} matches it"
    sets = {f: want[f] for f in want if f != "ffn_dim"}
    if m.ffn_dim != want["ffn_dim"]:  # Llama's width rounds up to multiple_of: a multiple of the width itself gives it
        base = int(2 * 4 * want["dim"] / 3)
        sets |= {"ffn_dim_multiplier": min(1.0, want["ffn_dim"] / base), "multiple_of": want["ffn_dim"]}
    words = [f"model.{k}={str(v).lower() if isinstance(v, bool) else v}" for k, v in sets.items() if getattr(m, k) != v]
    return "set " + " ".join(words) + " to match it"
