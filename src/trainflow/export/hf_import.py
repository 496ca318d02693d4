"""Start a run from a Hugging Face LlamaForCausalLM folder (io.init_from): its weights read into the parameters this
rank holds, in any layout, through DCP.

    python -c "from pathlib import Path; from trainflow.config import compose; from trainflow.model import Llama; \
        from trainflow.export.hf_import import load_hf; m = compose('train_segment').model; \
        print(load_hf(Path('hf/tiny'), [Llama(m)], m))"

DCP plans the load as it plans a resume: each rank asks for exactly the chunks of the parameters it holds (a
tensor-parallel or FSDP shard, its pipeline stage's layers), under Hugging Face's names (config.hf), and
HfReader (torch's HuggingFaceStorageReader, checked) reads those slices from the safetensors files, a file at a
time: no rank ever holds more of the model than its own parameters. bf16 or fp16 weights become the fp32 master
weights on the way in. The optimizer is not touched, so it starts fresh; fp8's amax histories keep their start.
The folder is checked again before anything is read (config.hf_weights: names, shapes, truncation), since it may
have changed since the config was validated; only safetensors are read.
"""

from __future__ import annotations

import logging
import time
import warnings
from dataclasses import dataclass
from pathlib import Path

import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch import nn
from torch.distributed.checkpoint import HuggingFaceStorageReader
from torch.distributed.checkpoint.default_planner import DefaultLoadPlanner
from torch.distributed.checkpoint.metadata import Metadata
from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict, set_model_state_dict

from trainflow.config import ModelConfig
from trainflow.config.hf import HfFolderError, check_config, hf_name
from trainflow.config.hf_weights import weight_files
from trainflow.export.source import FP8_STATE

log = logging.getLogger(__name__)
FLAT = StateDictOptions(flatten_optimizer_state_dict=True)


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


class HfReader(HuggingFaceStorageReader):
    """torch's reader of a safetensors folder, which reads every *.safetensors file it finds: the folder's files are
    checked against the model first (config.hf_weights), so those are exactly the index's and hold what they should."""

    def __init__(self, folder: Path, m: ModelConfig) -> None:
        super().__init__(str(folder))
        self.folder, self.m = folder, m

    def read_metadata(self) -> Metadata:
        check_config(self.folder, self.m)
        weight_files(self.folder, self.m)
        return super().read_metadata()


def load_hf(folder: Path, parts: list[nn.Module], m: ModelConfig) -> Imported:
    """Fill the model chunks `parts` (this rank's, any layout) with the folder's weights; a collective when a
    process group is up (every rank calls it), one process's load otherwise."""
    start = time.perf_counter()
    states = [get_model_state_dict(part, options=FLAT) for part in parts]
    hf = {hf_name(k): v for state in states for k, v in state.items() if not k.endswith(FP8_STATE)}
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
    for part, state in zip(parts, states):  # the state's tensors are the parameters; this also fills non-views
        set_model_state_dict(part, state, options=StateDictOptions(strict=False))
    local = [v.to_local() if hasattr(v, "to_local") else v for v in hf.values()]
    files = len(list(folder.glob("*.safetensors")))
    done = Imported(files, len(hf), sum(t.nbytes for t in local), time.perf_counter() - start)
    if not dist.is_initialized() or dist.get_rank() == 0:
        log.info(
            "Initialised the model from %s (%d files; rank 0 read %d tensors, %.1f MB, in %.2f s); the optimizer "
            "starts fresh",
            *(folder, done.files, done.tensors, done.bytes / 1e6, done.seconds),
        )
    return done


def recorded_init_from(manifest: dict) -> str | None:
    """The folder a checkpoint's run started from (its manifest's init_from; None: random weights). The manifest is
    untrusted: anything but text is no folder."""
    value = manifest.get("init_from")
    return value if isinstance(value, str) else None
