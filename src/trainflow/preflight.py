"""The pre-flight checks: a validated config against the machine it is to run on. Files it names must parse (a
pretrained tokenizer, the Hugging Face folder of io.init_from), folders it writes must be writable, tools it needs
must be installed. Composition checks the config alone (trainflow.config.checks); the workflow runs these when it
builds the DAG, and every stage again before it runs (trainflow.stage.run_stage), since files change in between.

    python -c "from trainflow.config import compose; from trainflow.preflight import preflight; \
        preflight(compose('train_segment', ['io.init_from=hf/Meta-Llama-3-8B']))"

`preflight` raises one ConfigError whose message names every offending value and the fix.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

from trainflow.config.schema import DataConfig, ModelConfig, TrainflowConfig
from trainflow.errors import ConfigError
from trainflow.hf.llama import HfFolderError, check_config
from trainflow.hf.weights import weight_files


def preflight(cfg: TrainflowConfig) -> None:
    """Raise one ConfigError listing every check the machine fails, with its fix."""
    if errors := host_errors(cfg):
        raise ConfigError("config cannot run here: " + "; ".join(errors))


def host_errors(cfg: TrainflowConfig) -> list[str]:
    t, errors = cfg.train, []
    if t.offload_dir and t.activations == "offload" and (why := unwritable(t.offload_dir)):
        errors.append(f"train.offload_dir({t.offload_dir!r}) {why}; give a writable folder on the fast tier")
    if t.compiled(cfg.cluster.runtime.device) and cfg.cluster.runtime.device == "cpu" and (why := missing_compiler()):
        errors.append(f"train.compile=true {why}")
    return errors + tokenizer_errors(cfg.data) + init_from_errors(cfg.io.init_from, cfg.model)


def tokenizer_errors(d: DataConfig) -> list[str]:
    """A pretrained tokenizer must parse, and its vocabulary be data.vocab_size (which the model's must hold)."""
    if d.tokenizer != "pretrained":
        return []
    from tokenizers import Tokenizer  # only here: checking any other config does not load it

    try:
        size = Tokenizer.from_file(d.tokenizer_path).get_vocab_size(with_added_tokens=True)
    except Exception as err:  # tokenizers raises plain Exceptions
        reason = str(err).replace("\n", " ")
        return [f"data.tokenizer_path({d.tokenizer_path!r}) is no readable tokenizer.json ({reason}); give one"]
    if size != d.vocab_size:
        return [f"data.vocab_size({d.vocab_size}) must be {size}, the size of data.tokenizer_path's vocabulary"]
    return []


def init_from_errors(init_from: str, m: ModelConfig) -> list[str]:
    """The Hugging Face folder of io.init_from (empty: none to start from): its config.json must describe the model
    `m` and its safetensors headers hold exactly the model's weights (no tensor is read)."""
    if not init_from:
        return []
    try:
        check_config(Path(init_from), m)
        weight_files(Path(init_from), m)
    except HfFolderError as err:
        return [str(err)]
    return []


def unwritable(folder: str) -> str | None:
    """Why files cannot be written under `folder` (None: they can); it is created if missing."""
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
