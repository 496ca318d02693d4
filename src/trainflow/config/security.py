"""The allow-lists of docs/security.md that a composed config must pass: the characters a storage or io
path may hold, and the environment variables ranks may be given. (Which workflow overrides may be given at all is
config.overrides'.)

    python -c "from trainflow.config.security import unsafe_path; print(unsafe_path('io.report', 'a/../../b'))"
"""

from __future__ import annotations

import re
from dataclasses import fields
from pathlib import PurePosixPath

from trainflow.config.cluster import ContainerConfig
from trainflow.config.schema import TrainflowConfig

# Quotes, backslashes and `$` would need escaping twice (shell, then Hydra's quoted strings); control
# characters break command lines and logs. Spaces, commas, brackets and the like are fine: stage command
# lines quote every path for both.
UNSAFE_PATH_CHARS = r"[\x00-\x1f\x7f'\"\\$`]"

# Variables the ranks may be given (cluster.runtime.env): the communication and threading libraries' own. Names
# that make a library load code (NCCL's *_PLUGIN) or write where they say (NCCL_DEBUG_FILE) are refused.
ENV_NAME = r"(NCCL|TORCH|CUDA|FI|UCX|GLOO|OMP|MKL|MPICH|NVSHMEM|CXI)_[A-Z0-9_]+"
ENV_REFUSED = r".*PLUGIN.*|NCCL_DEBUG_FILE"


def security_errors(cfg: TrainflowConfig) -> list[str]:
    a = cfg.cluster.allocation
    return path_errors(cfg) + env_errors(cfg.cluster.runtime.env) + container_errors(a.container, executor=a.executor)


def path_errors(cfg: TrainflowConfig) -> list[str]:
    """Storage and io paths, in order: none of UNSAFE_PATH_CHARS and no '..' (normalised, such a path
    can climb out of the folder it is declared in)."""
    paths = [
        (f"{section}.{f.name}", getattr(node, f.name))
        for section, node in (("storage", cfg.storage), ("io", cfg.io))
        for f in fields(node)
    ] + [("train.offload_dir", cfg.train.offload_dir)]
    paths += [(f"evaluate.tasks[{i}].path", t.path) for i, t in enumerate(cfg.evaluate.tasks)]
    for key, value in paths:
        for path in value if isinstance(value, list) else [value]:
            if why := unsafe_path(key, path):
                return [why]
    return []  # one error at most: the paths derive from each other, so the first names the cause


def unsafe_path(key: str, path: str) -> str | None:
    """Why trainflow refuses to read or write `path` (None: it does not): UNSAFE_PATH_CHARS or '..'."""
    if bad := re.search(UNSAFE_PATH_CHARS, path):
        return f"{key}({path!r}) holds {bad[0]!r}, which trainflow does not pass to a shell or Hydra; rename it"
    if ".." in PurePosixPath(path).parts:
        return f"{key}({path!r}) climbs out of its folder through '..'; give the path without '..'"
    return None


def env_errors(env: dict[str, str]) -> list[str]:
    errors = []
    for name, value in env.items():
        if not re.fullmatch(ENV_NAME, name) or re.fullmatch(ENV_REFUSED, name):
            errors.append(
                f"cluster.runtime.env.{name} is not a variable trainflow passes to ranks: only NCCL_*, TORCH_*, "
                "CUDA_*, FI_*, UCX_*, GLOO_*, OMP_*, MKL_*, MPICH_*, NVSHMEM_*, CXI_* (none that loads a plugin or "
                "names a file to write)"
            )
        elif re.search(r"[\x00-\x1f\x7f]", str(value)):
            errors.append(f"cluster.runtime.env.{name}({value!r}) holds a control character; give a one-line value")
    return errors


def container_errors(c: ContainerConfig, *, executor: str) -> list[str]:
    """cluster.allocation.container beyond its fields' characters (config.domain's CONTAINER_FILE, BIND_MOUNT): one
    container, an image that is one, no '..', and only where srun starts the ranks."""
    key = "cluster.allocation.container"
    if c.edf and c.sif:
        return [f"{key}.edf({c.edf}) and {key}.sif({c.sif}) are both set: the ranks run in one container; keep one"]
    for name, value in (("edf", c.edf), ("sif", c.sif), ("python", c.python), *(("binds", b) for b in c.binds)):
        if any(".." in PurePosixPath(part).parts for part in value.split(":")):
            return [f"{key}.{name}({value}) climbs out of its folder through '..'; give the path without '..'"]
    if c.sif and not c.sif.endswith(".sif"):
        return [f"{key}.sif({c.sif}) is not an Apptainer image (.sif): build one from containers/trainflow.def"]
    if c.edf and "/" in c.edf and not c.edf.endswith(".toml"):
        return [f"{key}.edf({c.edf}) is a path but not a .toml EDF: give the EDF file, or its name in ~/.edf"]
    if c.binds and not c.sif:
        return [f"{key}.binds({c.binds}) are Apptainer's: set {key}.sif too, or list the mounts in the EDF"]
    if (c.edf or c.sif) and executor != "slurm":
        return [f"{key} runs the ranks through srun: it needs cluster.allocation.executor=slurm (here {executor})"]
    return []
