"""The weights of a Hugging Face folder (io.init_from), checked from the files' headers: which safetensors files hold
them (model.safetensors, or the shards model.safetensors.index.json lists), and each file's header against the
model: every parameter once, of its shape, in a floating dtype, and no file cut short. Only a tied folder that also
holds lm_head.weight (some exports write both) has a tensor read: that one, compared with the embedding.

    python -c "from pathlib import Path; from trainflow.config import compose; \
        from trainflow.hf.weights import weight_files; \
        print(weight_files(Path('hf/tiny'), compose('train_segment').model))"

Only safetensors are read: a folder of pickle files (pytorch_model.bin, *.pth), which can run code when
loaded, is refused with the conversion to make. safetensors' own parser reads each header (it refuses a header
that is malformed or promises more bytes than the file holds), with the numpy framework, so no torch here.
"""

from __future__ import annotations

import json
import re
import struct
from pathlib import Path

from safetensors import SafetensorError, safe_open

from trainflow.config.schema import ModelConfig
from trainflow.hf.llama import HfFolderError, folder_shapes, hf_name

SINGLE = "model.safetensors"
INDEX = "model.safetensors.index.json"
PICKLES = ("*.bin", "*.pth", "*.pt", "*.ckpt")
FLOATS = ("F32", "BF16", "F16")
DCP_SHARDING = "DCP_SHARDING_INFO"
"""The metadata key of torch's sharded HF writer, whose offsets torch's reader would apply: not a published model."""
HEAD, EMBEDDING = hf_name("output.weight"), hf_name("tok_embeddings.weight")
"""A tied folder's head is its embedding; one that holds an lm_head.weight too is read as transformers reads it: tied
where the two are equal, a separate head where not (which a tied model cannot take)."""
CHUNK = 1 << 24
"""Bytes compared at a time."""
DERIVED = re.compile(r"model\.layers\.\d+\.self_attn\.rotary_emb\.inv_freq")
"""A buffer older transformers saved beside the weights; derived from config.json, so not read."""


def index_files(folder: Path) -> dict[str, str]:
    """Tensor name -> the file holding it, as the index says (or everything in model.safetensors)."""
    if (folder / INDEX).is_file():
        path = folder / INDEX
        try:
            weight_map = json.loads(path.read_text(encoding="utf-8"))["weight_map"]
            if not isinstance(weight_map, dict) or not all(isinstance(v, str) for v in weight_map.values()):
                raise TypeError("weight_map is no object of file names")
        except (OSError, UnicodeDecodeError, ValueError, KeyError, TypeError, RecursionError) as err:
            raise HfFolderError(
                f"{path} is no safetensors index ({' '.join(str(err).split())}); download it again"
            ) from err
        if bad := next((f for f in weight_map.values() if not re.fullmatch(r"[\w.-]+\.safetensors", f)), None):
            raise HfFolderError(f"{path} names {bad!r}, not a .safetensors file beside it; download it again")
        return weight_map
    if (folder / SINGLE).is_file():
        return {}
    pickles = sorted(p.name for pattern in PICKLES for p in folder.glob(pattern))
    if pickles:
        raise HfFolderError(
            f"{folder} holds {pickles[0]} but no safetensors: pickle files can run code when loaded, so trainflow "
            "reads safetensors only; download the model's .safetensors files, or convert these where you trust them "
            "(transformers: from_pretrained(...).save_pretrained(out, safe_serialization=True))"
        )
    raise HfFolderError(f"{folder} holds neither {SINGLE} nor {INDEX}; give a Hugging Face model folder")


def read_header(path: Path) -> dict[str, tuple[str, tuple[int, ...]]]:
    """Tensor name -> (dtype, shape) of one safetensors file, from its header alone."""
    try:
        with safe_open(str(path), framework="numpy") as f:
            if DCP_SHARDING in (f.metadata() or {}):
                raise HfFolderError(f"{path} is a DCP shard ({DCP_SHARDING}), not a model file; consolidate it first")
            return {k: (f.get_slice(k).get_dtype(), tuple(f.get_slice(k).get_shape())) for k in f.keys()}
    except (SafetensorError, OSError) as err:
        why = " ".join(str(err).split())
        raise HfFolderError(
            f"{path} cannot be read as safetensors ({why}): it is truncated or damaged; download it again"
        ) from err


def weight_files(folder: Path, m: ModelConfig) -> dict[str, list[str]]:
    """Each safetensors file of the folder and the Hugging Face names of the parameters it holds; one HfFolderError
    for a file that is missing, unlisted, truncated or holds a tensor this model has not, lacks or shapes otherwise."""
    listed = index_files(folder)
    files = sorted(set(listed.values())) or [SINGLE]
    present = sorted(p.name for p in folder.glob("*.safetensors"))
    if odd := sorted(set(files) ^ set(present)):
        side = "lacks" if odd[0] in files else "holds the unlisted"
        raise HfFolderError(f"{folder} {side} {odd[0]} (its index lists {len(files)} files); download the model again")
    want = {hf_name(name): shape for name, shape in folder_shapes(m).items()}
    where: dict[str, str] = {}
    for file in files:
        for name, (dtype, shape) in read_header(folder / file).items():
            if DERIVED.fullmatch(name):
                continue
            if name == HEAD and m.tie_embeddings and name not in where:  # transformers ties it if equal: compared below
                want[name] = want[EMBEDDING]
            if name not in want:
                raise HfFolderError(f"{folder / file} holds {name}, which {describe(m)} has not; {FIX}")
            if name in where:
                raise HfFolderError(f"{folder} holds {name} twice ({where[name]}, {file}); download the model again")
            if shape != want[name]:
                raise HfFolderError(
                    f"{folder / file} holds {name} of shape {shape} where {describe(m)} has {want[name]}; {FIX}"
                )
            if dtype not in FLOATS:
                raise HfFolderError(f"{folder / file} holds {name} as {dtype}; trainflow reads {', '.join(FLOATS)}")
            if listed and listed.get(name) != file:
                raise HfFolderError(f"{folder / INDEX} puts {name} in {listed.get(name)}, but {file} holds it")
            where[name] = file
    if missing := [name for name in want if name not in where]:
        raise HfFolderError(f"{folder} lacks {missing[0]} ({len(missing)} tensors missing) of {describe(m)}; {FIX}")
    if m.tie_embeddings and HEAD in where and not same_tensor(folder / where[HEAD], folder / where[EMBEDDING]):
        raise HfFolderError(
            f"{folder} ties its head to the embedding (config.json's tie_word_embeddings is true) but holds a {HEAD} "
            f"that differs from {EMBEDDING}, which transformers unties and loads as the head: if that is the model, "
            "set tie_word_embeddings to false in its config.json and give model.tie_embeddings=false"
        )
    return {file: [name for name, f in where.items() if f == file] for file in files}


def tensor_range(path: Path, name: str) -> tuple[int, int, str, list[int]]:
    """Where tensor `name` lies in the safetensors file (its first and end byte), its dtype and shape: the format's
    u64 header length and JSON header, which read_header had safetensors parse and validate first."""
    with open(path, "rb") as f:
        (size,) = struct.unpack("<Q", f.read(8))
        entry = json.loads(f.read(size))[name]
    begin, end = entry["data_offsets"]
    return 8 + size + begin, 8 + size + end, entry["dtype"], entry["shape"]


def same_tensor(head_file: Path, embedding_file: Path) -> bool:
    """Whether a tied folder's lm_head.weight holds the embedding's bytes (and dtype and shape), a chunk at a time."""
    (head, head_end, *head_kind), (embedding, _, *embedding_kind) = (
        tensor_range(head_file, HEAD),
        tensor_range(embedding_file, EMBEDDING),
    )
    if head_kind != embedding_kind:
        return False
    with open(head_file, "rb") as a, open(embedding_file, "rb") as b:
        a.seek(head)
        b.seek(embedding)
        for left in range(head_end - head, 0, -CHUNK):
            if a.read(min(CHUNK, left)) != b.read(min(CHUNK, left)):
                return False
    return True


FIX = "the weights do not match config.json (or the files are not this model's): download the model again"


def describe(m: ModelConfig) -> str:
    return f"a LlamaForCausalLM of {m.n_layers} layers, hidden size {m.dim} and vocabulary {m.vocab_size}"
