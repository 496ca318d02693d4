"""Start a run from a Hugging Face LlamaForCausalLM folder (io.init_from): its weights read into the parameters this
rank holds, in any layout, through DCP.

    python -c "from pathlib import Path; from trainflow.config import compose; from trainflow.model import Llama; \
        from trainflow.checkpoint.hf_reader import load_hf; m = compose('train_segment').model; \
        print(load_hf(Path('hf/tiny'), [Llama(m)], m))"

DCP plans the load as it plans a resume: each rank asks for exactly the chunks of the parameters it holds (a
tensor-parallel or FSDP shard, its pipeline stage's layers), under Hugging Face's names (hf.llama), and
HfReader (torch's HuggingFaceStorageReader, checked, reading as checkpoint.reading reads a DCP checkpoint) reads
those slices from the safetensors files, a file at a time: no rank ever holds more of the model than its own
parameters. bf16 or fp16 weights become the fp32 master
weights on the way in. The optimizer is not touched, so it starts fresh; fp8's amax histories keep their start.
The folder is checked again before anything is read (hf.weights: names, shapes, truncation), since it may
have changed since the config was validated; only safetensors are read.
"""

from __future__ import annotations

import io
import json
import logging
import math
import os
import struct
import threading
import time
import warnings
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch import nn
from torch.distributed.checkpoint import HuggingFaceStorageReader
from torch.distributed.checkpoint.default_planner import DefaultLoadPlanner
from torch.distributed.checkpoint.metadata import Metadata
from torch.distributed.checkpoint.planner import LoadPlanner, ReadItem
from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict, set_model_state_dict

from trainflow.checkpoint.reading import InPlaceReading, read_into
from trainflow.checkpoint.state import FP8_STATE
from trainflow.config import ModelConfig
from trainflow.hf.llama import HfFolderError, check_config, hf_name
from trainflow.hf.weights import weight_files
from trainflow.tensors import local, storage_ptr

log = logging.getLogger(__name__)
FLAT = StateDictOptions(flatten_optimizer_state_dict=True)
STAGING = 4 << 20  # bytes of a file's dtype read, then converted, at a time (bf16 weights into fp32 parameters)


@dataclass(frozen=True)
class Imported:
    """What load_hf read on this rank."""

    files: int
    """Safetensors files of the folder."""
    tensors: int
    """This rank's parameters filled."""
    bytes: int
    """Bytes of this rank's parameters (their fp32 local shards)."""
    seconds: float


class HfReader(InPlaceReading, HuggingFaceStorageReader):
    """torch's reader of a safetensors folder, which reads every *.safetensors file it finds: the folder's files are
    checked against the model first (hf.weights), so those are exactly the index's and hold what they should.

    torch's reader copies each slice out of safetensors' memory map, page fault by page fault (0.3-0.6 GB/s here,
    a quarter of a plain read). A slice that is whole rows of a tensor (the whole tensor, or a dim-0 shard: column
    parallel, FSDP) is one byte range of the file, so it is read with readinto straight into the destination, or
    piece by piece into a small staging buffer of the file's dtype, each piece converted into place (bf16 into fp32).
    Other slices (row-parallel shards split dim 1) go through torch's path."""

    def __init__(self, folder: Path, m: ModelConfig, *, thread_count: int = 2) -> None:
        super().__init__(str(folder), thread_count=thread_count)
        self.folder, self.m = folder, m
        self.headers: dict[str, tuple[int, dict]] = {}
        self.local = threading.local()  # each reading thread's staging buffer

    def read_metadata(self) -> Metadata:
        check_config(self.folder, self.m)
        weight_files(self.folder, self.m)
        return super().read_metadata()

    def item_file(self, item: ReadItem) -> str:
        return self.storage_data[item.storage_index].relative_path

    def item_offset(self, item: ReadItem) -> int:
        start, header = self.header(self.item_file(item))
        return start + header[item.storage_index.fqn]["data_offsets"][0]

    def header(self, path: str) -> tuple[int, dict]:
        """(where the file's data begins, its header): safetensors' layout, a u64 length and that much JSON, which
        read_metadata's check had safetensors parse and validate first."""
        if path not in self.headers:
            with open(path, "rb") as raw:
                (size,) = struct.unpack("<Q", raw.read(8))
                self.headers[path] = (8 + size, json.loads(raw.read(size)))
        return self.headers[path]

    def read_in_place(self, f: io.BufferedReader, req: ReadItem, planner: LoadPlanner) -> bool:
        """Read a slice of whole rows in place; False where it is something else (torch's path reads it)."""
        info = self.storage_data[req.storage_index]
        target = planner.resolve_tensor(req).detach()
        shape, offsets, lengths = tuple(info.shape), tuple(req.storage_offsets), tuple(req.lengths)
        if shape[1:] != lengths[1:] or any(offsets[1:]) or not target.is_contiguous() or target.device.type != "cpu":
            return False
        row = math.prod(shape[1:]) * info.dtype.itemsize
        begin = self.item_offset(req) + (offsets[0] * row if shape else 0)
        flat, name = target.view(-1), req.storage_index.fqn
        f.seek(begin)
        # The kernel reads the range ahead while pieces are converted: disk and CPU work at once.
        os.posix_fadvise(f.fileno(), begin, flat.numel() * info.dtype.itemsize, os.POSIX_FADV_WILLNEED)
        if target.dtype == info.dtype:
            read_into(f, flat, name=name)
        else:  # through a small buffer that stays in cache: read a piece, convert it into place, read on
            step = STAGING // info.dtype.itemsize
            for at in range(0, flat.numel(), step):
                piece = self.staging(min(step, flat.numel() - at), info.dtype)
                read_into(f, piece, name=name)
                widen(piece, flat[at : at + piece.numel()])
        planner.commit_tensor(req, target)
        return True

    def staging(self, numel: int, dtype: torch.dtype) -> torch.Tensor:
        """This thread's STAGING-byte buffer, as `numel` elements of `dtype`."""
        if not hasattr(self.local, "buffer"):
            self.local.buffer = torch.empty(STAGING, dtype=torch.uint8)
        return self.local.buffer[: numel * dtype.itemsize].view(dtype)


def load_hf(folder: Path, parts: list[nn.Module], m: ModelConfig) -> Imported:
    """Fill the model chunks `parts` (this rank's, any layout) with the folder's weights; a collective when a
    process group is up (every rank calls it), one process's load otherwise."""
    start = time.perf_counter()
    states = [get_model_state_dict(part, options=FLAT) for part in parts]
    # A tied head reads the embedding's tensor: one key where a rank holds both, the last stage's copy elsewhere.
    hf = {
        hf_name(k, tied=m.tie_embeddings): v for state in states for k, v in state.items() if not k.endswith(FP8_STATE)
    }
    try:
        with warnings.catch_warnings():  # DCP's notice that it loads in one process, where there is no group
            warnings.filterwarnings("ignore", "torch.distributed is disabled", UserWarning)
            dcp.load(
                hf,
                storage_reader=HfReader(folder, m),
                planner=DefaultLoadPlanner(),
                no_dist=not dist.is_initialized(),
            )
    except dcp.api.CheckpointException as err:
        _, (cause, _) = next(iter(err.failures.items()))
        if isinstance(cause, HfFolderError):
            raise HfFolderError(str(cause)) from None
        raise HfFolderError(f"reading io.init_from({folder}) failed: {' '.join(str(cause).split())}") from err
    for part, state in zip(parts, states):
        # DCP filled the state's tensors in place; where they are the parameters' own memory (plain, tp, FSDP2),
        # copying them back would only copy the whole model once more.
        params = {storage_ptr(p) for p in part.parameters()}
        if any(storage_ptr(v) not in params for v in state.values()):
            set_model_state_dict(part, state, options=StateDictOptions(strict=False))
    done = Imported(
        files=len(list(folder.glob("*.safetensors"))),
        tensors=len(hf),
        bytes=sum(local(t).nbytes for t in hf.values()),
        seconds=time.perf_counter() - start,
    )
    if not dist.is_initialized() or dist.get_rank() == 0:
        log.info(
            "Initialised the model from %s (%d files; rank 0 read %d tensors, %.1f MB, in %.2f s); the optimizer "
            "starts fresh",
            *(folder, done.files, done.tensors, done.bytes / 1e6, done.seconds),
        )
    return done


def widen(piece: torch.Tensor, into: torch.Tensor) -> None:
    """Convert `piece` into `into` (contiguous, CPU). bf16 is fp32's top half, so bf16 -> fp32 is a 16-bit shift,
    done by numpy: 3.6 GB/s here where torch's copy_ converts at 0.3 GB/s; the bits are the same."""
    if piece.dtype == torch.bfloat16 and into.dtype == torch.float32:
        bits = piece.view(torch.int16).numpy().view(np.uint16)
        np.left_shift(bits, 16, out=into.numpy().view(np.uint32), dtype=np.uint32)
    else:
        into.copy_(piece)
