"""The pre-flight checks: a validated config against the machine it is to run on. Files it names must parse (a
pretrained tokenizer, the Hugging Face folder of io.init_from), folders it writes must be writable, tools it needs
must be installed. Composition checks the config alone (trainflow.config.checks); the workflow runs these when it
builds the DAG, and every stage again before it runs (trainflow.stage.run_stage), since files change in between.

    python -c "from trainflow.config import compose; from trainflow.preflight import preflight; \
        preflight(compose('train_segment', ['io.init_from=hf/Meta-Llama-3-8B']))"

`preflight` raises one ConfigError whose message names every offending value and the fix.

A local world (cluster.allocation.executor=local: every rank a process on this machine) must fit the machine: at most
RANKS_PER_CORE ranks per core it may use and RANK_PROCESS_GB of available memory per rank (what a rank costs before
its tensors, which the plan counts against cluster.allocation.mem_gb).

The trackers (observe.wandb, observe.mlflow) are checked where a job that logs to them is submitted (the DAG's build
and train_segment, whose config it is): their package must import and their server answer within REACH_S, as the ranks
would otherwise learn it minutes into their allocation. A tracker that fails later only warns (train.trackers.Guarded).
"""

from __future__ import annotations

import importlib
import importlib.util
import math
import os
import re
import shutil
import socket
import threading
from pathlib import Path
from urllib.parse import urlsplit

from trainflow.config.observe import FILE_SCHEMES, SERVER_SCHEMES, MlflowConfig, WandbConfig
from trainflow.config.schema import DataConfig, ModelConfig, ObserveConfig, TrainflowConfig
from trainflow.config.shape import total_params
from trainflow.config.stages import ALLOCATING
from trainflow.errors import ConfigError
from trainflow.hf.llama import HfFolderError, check_config
from trainflow.hf.weights import weight_files

HARNESS_INSTALL = "pip install lm_eval==0.4.13 into the run's environment"
MAX_TASK_DEFINITIONS = 10_000
"""Task definition files a folder of lm-eval tasks may hold (lm-eval's own package has ~12,000)."""
TASK_DEFINITION_BYTES = 1 << 20
"""More than any task definition (lm-eval's own largest is 62 KB): a bigger file is not read."""
TASK_CODE = re.compile(r"!function|^\s*include\s*:\s*\S*[/\\]", re.MULTILINE)
"""What an lm-eval task definition holds to import Python or include a file by path (trainflow.evaluate.harness)."""


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
    errors += tracker_errors(cfg.observe) if cfg.stage == "train_segment" else []
    errors += local_world_errors(cfg) if cfg.stage in ALLOCATING else []
    errors += tokenizer_errors(cfg.data) + init_from_errors(cfg.io.init_from, cfg.model) + task_errors(cfg)
    return errors + (evaluation_errors(cfg) if cfg.stage == "evaluate" else [])  # and the DAG's build: common.smk


def load_bytes(m: ModelConfig) -> int:
    """What the evaluate job holds as a checkpoint loads: the model's fp32 weights, and their fp32 tensors read from
    the checkpoint beside them (trainflow.stages.evaluate.load_model)."""
    return 2 * 4 * total_params(m)


def evaluation_errors(cfg: TrainflowConfig) -> list[str]:
    """An enabled evaluation fits its one process: the node's memory and, on GPUs, one device's. Checked where an
    evaluation is to run: the DAG's build (workflow/rules/common.smk) and the evaluate stage."""
    if not cfg.evaluate.enabled:
        return []
    c = cfg.cluster
    room = {"cluster.allocation.mem_gb": c.allocation.mem_gb}
    if c.runtime.device == "cuda":
        room["cluster.hardware.device_memory_gb"] = c.hardware.device_memory_gb
    key, gb = min(room.items(), key=lambda kv: kv[1])
    if (need := load_bytes(cfg.model) / 1e9) <= gb:
        return []
    return [
        f"evaluate loads {cfg.model.name} in fp32 into one process, {need:.0f} GB while its checkpoint loads, more "
        f"than {key}({gb:g}): a model this size needs its evaluation spread over ranks as training holds it, which is "
        "not built; set evaluate.enabled=false"
    ]


def task_errors(cfg: TrainflowConfig) -> list[str]:
    """Every task file of evaluate.tasks is a file (what it holds is read, line by line, when it is scored); a harness
    task's lm_eval is installed and its folder of definitions holds data only (trainflow.evaluate.harness)."""
    errors = [
        f"evaluate.tasks[{i}].path({t.path!r}) (task {t.name!r}) is no file; give the path of its JSONL file"
        for i, t in enumerate(cfg.evaluate.tasks)
        if t.kind != "harness" and not Path(t.path).is_file()
    ]
    if harness := [t for t in cfg.evaluate.tasks if t.kind == "harness"]:
        if importlib.util.find_spec("lm_eval") is None:
            first = cfg.evaluate.tasks.index(harness[0])
            errors.append(f"evaluate.tasks[{first}] is an lm-eval task; {HARNESS_INSTALL}")
        errors += [e for folder in sorted({t.path for t in harness if t.path}) for e in harness_folder_errors(folder)]
    return errors


def harness_folder_errors(folder: str) -> list[str]:
    """A folder of extra task definitions is a folder of YAML files none of which imports code or reaches for a file
    by path."""
    root = Path(folder)
    if not root.is_dir():
        return [f"{folder!r} is no folder of lm-eval task definitions; give one, or '' for the package's own tasks"]
    files = [p for p in root.rglob("*") if p.suffix in (".yaml", ".yml")]
    if len(files) > MAX_TASK_DEFINITIONS:
        return [
            f"{folder} holds {len(files)} task definitions, more than {MAX_TASK_DEFINITIONS}; give a smaller folder"
        ]
    errors = []
    for path in sorted(files):
        if not path.is_file():  # a FIFO or a device is not read
            continue
        try:
            if path.stat().st_size > TASK_DEFINITION_BYTES:
                errors.append(f"{path} is larger than {TASK_DEFINITION_BYTES} bytes; no task definition is")
                continue
            text = path.read_text(errors="replace")
        except OSError as err:
            errors.append(f"{path} cannot be read ({err.strerror}); give a readable task definition")
            continue
        if found := TASK_CODE.search(text):
            errors.append(
                f"{path} holds {found.group().strip()!r}: a task folder is read as data, and that imports code or "
                "reads a file by path; write the task with templates (doc_to_text, doc_to_choice, doc_to_target) "
                "and include definitions by name"
            )
    return errors


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


REACH_S = 3.0
"""How long a tracker's server has to accept a connection before the run is refused."""


def tracker_errors(o: ObserveConfig) -> list[str]:
    """Each enabled tracker's package imports here, and its server (W&B online, an MLflow URI with a host) accepts a
    connection within REACH_S; an MLflow store on a file system lies in a writable folder."""
    errors = []
    if o.wandb.enabled:
        errors += wandb_errors(o.wandb)
    if o.mlflow.enabled:
        errors += mlflow_reach_errors(o.mlflow)
    return errors


def missing_package(key: str, name: str) -> str | None:
    """Why observe.<key> cannot log here if its package does not import (None: it imports)."""
    try:
        importlib.import_module(name)
    except ImportError as err:
        return (
            f"observe.{key}.enabled=true needs the {name} package, which does not import here ({err}): pip install "
            f"{name} into this environment (trainflow's test extra holds it), or set observe.{key}.enabled=false"
        )
    return None


def wandb_errors(w: WandbConfig) -> list[str]:
    if why := missing_package("wandb", "wandb"):
        return [why]
    if w.mode == "offline":
        return []
    import wandb  # imported above

    settings = wandb.Settings()  # the server wandb.init would use: its settings files', then WANDB_BASE_URL
    settings.update_from_system_settings()
    settings.update_from_env_vars(dict(os.environ))
    url = settings.base_url
    parts = urlsplit(url)
    if why := unreachable(parts.hostname or "", parts.port or SERVER_SCHEMES.get(parts.scheme, 443)):
        return [
            f"observe.wandb.mode=online cannot reach W&B at {url}: {why}; set observe.wandb.mode=offline (then "
            "`wandb sync` the run's wandb folder), or run where the server answers"
        ]
    return []


def mlflow_reach_errors(m: MlflowConfig) -> list[str]:
    if why := missing_package("mlflow", "mlflow"):
        return [why]
    parts = urlsplit(m.uri)
    if parts.scheme in FILE_SCHEMES and (why := unwritable(store := file_store(parts.scheme, parts.path))):
        return [f"observe.mlflow.uri({m.uri!r}): its folder {store} {why}; give a store in a writable folder"]
    if parts.scheme in SERVER_SCHEMES and (
        why := unreachable(parts.hostname, parts.port or SERVER_SCHEMES[parts.scheme])
    ):
        return [
            f"observe.mlflow.uri({m.uri!r}) does not answer: {why}; start the tracking server, give one that answers, "
            "or leave the URI empty for a store in the run folder"
        ]
    return []


def file_store(scheme: str, path: str) -> str:
    """The folder an MLflow store on a file system writes: a file:// URI's path, a SQLite file's folder (SQLAlchemy's
    sqlite:///relative.db and sqlite:////absolute.db)."""
    return path if scheme == "file" else os.path.dirname(path[1:]) or "."


def unreachable(host: str, port: int) -> str | None:
    """Why nothing accepts a TCP connection at host:port within REACH_S (None: something did). The name lookup runs in
    the same bounded wait: a resolver that never answers must not hold the DAG's build."""
    outcome: list[str | None] = []

    def connect() -> None:
        try:
            socket.create_connection((host, port), timeout=REACH_S).close()
            outcome.append(None)
        except OSError as err:
            outcome.append(f"{host}:{port} refused or failed ({err.strerror or err})")

    attempt = threading.Thread(target=connect, daemon=True)
    attempt.start()
    attempt.join(REACH_S + 0.5)
    return outcome[0] if outcome else f"{host}:{port} did not answer within {REACH_S:g} s"


RANKS_PER_CORE = 4
"""The most local ranks a core runs: 8 on the 2-core dev VM train, time-sliced (an 8-rank 3D step, 16 s under a
torchrun-style launch); past that a gloo collective's 60 s timeout is at risk."""
RANK_PROCESS_GB = 0.3
"""What a local rank's process holds before its tensors: torch, gloo, trainflow and a tiny model measured 0.30 GB
proportional set size (0.42 GB resident, 0.26 GB private) per rank in a world of 4 (torch 2.13 CPU, 2026-12-04)."""


def local_world_errors(cfg: TrainflowConfig) -> list[str]:
    """A local world (cluster.allocation.executor=local) within this machine's cores and available memory."""
    if cfg.cluster.allocation.executor != "local":
        return []
    ranks, cores, available_gb = cfg.parallel.world_size, len(os.sched_getaffinity(0)), available_memory_gb()
    by_cores, by_memory = RANKS_PER_CORE * cores, int(available_gb / RANK_PROCESS_GB)
    if ranks <= min(by_cores, by_memory):
        return []
    limit, factors = min(by_cores, by_memory), {"dp": cfg.parallel.dp, "cp": cfg.parallel.cp}
    factors |= {"tp": cfg.parallel.tp, "pp": cfg.parallel.pp}
    key = max(factors, key=factors.get)  # the largest factor, lowered to a power of two that fits
    lower = 2 ** math.floor(math.log2(factors[key] * limit / ranks)) if factors[key] * limit >= ranks else 1
    layout = " * ".join(f"{k}({v})" for k, v in factors.items())
    return [
        f"the local world of {ranks} ranks ({layout}) does not fit this machine: its {cores} cores run at most "
        f"{by_cores} ({RANKS_PER_CORE} a core) and its {available_gb:.1f} GB available memory {by_memory} "
        f"({RANK_PROCESS_GB:g} GB a rank's process); lower parallel.{key} to {lower}, or train on a cluster"
    ]


def available_memory_gb() -> float:
    """The memory this machine can give new processes now (/proc/meminfo's MemAvailable)."""
    with open("/proc/meminfo") as f:
        fields = dict(line.split(":", 1) for line in f)
    return int(fields["MemAvailable"].split()[0]) * 1024 / 1e9
