"""A Hugging Face folder written all or nothing (what trainflow.export writes): config.json and the other small
files, and the weights as one model.safetensors or, past `max_shard_bytes`, as shards
model-0000i-of-0000n.safetensors with the index model.safetensors.index.json that transformers reads (the names
are hf.llama's, the file names hf.weights').

    python -c "from trainflow.hf.write import plan_shards; print(plan_shards({'a': (1024, 1024), 'b': (8,)}, 2**22))"

Shards are written one at a time, each read just before it is written (`read` below), so a writer holds at most one
shard's tensors in memory: a 70B model (280 GB in fp32) exports in 5 GB pieces. The tensors are torch's, so
safetensors' torch writer is imported when a folder is written; the module itself imports no torch.
"""

from __future__ import annotations

import json
import math
import os
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

from safetensors import SafetensorError

from trainflow.atomic import fsync_path
from trainflow.errors import TrainflowError
from trainflow.hf.weights import INDEX, SINGLE

if TYPE_CHECKING:
    import torch

MAX_SHARD_BYTES = 5 * 10**9
"""transformers' own default shard size (save_pretrained's max_shard_size="5GB")."""


class HfWriteError(TrainflowError):
    """A Hugging Face folder that could not be written (a full disk, a folder without permission)."""


def plan_shards(shapes: dict[str, tuple[int, ...]], max_bytes: int) -> list[list[str]]:
    """The tensors' names (in model order) cut into consecutive shards of at most `max_bytes` of fp32 each; a
    tensor larger than that is a shard of its own, as transformers cuts them."""
    shards: list[list[str]] = [[]]
    size = 0
    for name, shape in shapes.items():
        nbytes = 4 * math.prod(shape)
        if shards[-1] and size + nbytes > max_bytes:
            shards.append([])
            size = 0
        shards[-1].append(name)
        size += nbytes
    return shards


def shard_names(count: int) -> list[str]:
    return [SINGLE] if count == 1 else [f"model-{i:05d}-of-{count:05d}.safetensors" for i in range(1, count + 1)]


def write_folder(
    out: Path, files: dict[str, str], shards: list[list[str]], read: Callable[[list[str]], dict[str, torch.Tensor]]
) -> int:
    """Write `files` (name -> text) and the weights, shard by shard (`read(names)` gives a shard's tensors under
    their Hugging Face names), into a temporary folder beside `out`, fsync them and rename the folder to `out`; the
    weights' bytes. A failure removes the temporary folder and is one HfWriteError."""
    from safetensors.torch import save_file  # the caller's tensors are torch's

    tmp = out.parent / f".{out.name}.{os.getpid()}.tmp"
    try:
        out.parent.mkdir(parents=True, exist_ok=True)
        tmp.mkdir()
        for name, text in files.items():
            (tmp / name).write_text(text)
        weight_map, total = {}, 0
        for file, names in zip(shard_names(len(shards)), shards):
            tensors = read(names)
            save_file(tensors, tmp / file, metadata={"format": "pt"})
            total += sum(t.nbytes for t in tensors.values())
            weight_map |= dict.fromkeys(tensors, file)
            del tensors  # before the next shard is read: one shard in memory at a time
        if len(shards) > 1:
            index = {"metadata": {"total_size": total}, "weight_map": weight_map}
            (tmp / INDEX).write_text(json.dumps(index, indent=2) + "\n")
        umask = os.umask(0)
        os.umask(umask)
        for path in tmp.glob("*.safetensors"):
            path.chmod(0o666 & ~umask)  # safetensors writes each through a private temporary file
        for path in tmp.iterdir():
            fsync_path(path)
        tmp.rename(out)  # replaces an empty folder
        fsync_path(out.parent)
    except (OSError, SafetensorError) as err:
        why = f"{err.strerror} ({err.filename})" if isinstance(err, OSError) else " ".join(str(err).split())
        raise HfWriteError(
            f"writing {out} failed: {why}; free space or fix permissions there and export again"
        ) from err
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return total
