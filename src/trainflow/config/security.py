"""The allow-lists of the README's Security section that a composed config must pass: the characters a storage or io
path may hold, and the environment variables ranks may be given. (Which workflow overrides may be given at all is
config.overrides'.)

    python -c "from trainflow.config.security import unsafe_path; print(unsafe_path('io.report', 'a/../../b'))"
"""

from __future__ import annotations

import re
from dataclasses import fields
from pathlib import PurePosixPath

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
    return path_errors(cfg) + env_errors(cfg.cluster.runtime.env)


def path_errors(cfg: TrainflowConfig) -> list[str]:
    """Storage and io paths, in order: none of UNSAFE_PATH_CHARS and no '..' (normalised, such a path
    can climb out of the folder it is declared in)."""
    paths = [
        (f"{section}.{f.name}", getattr(node, f.name))
        for section, node in (("storage", cfg.storage), ("io", cfg.io))
        for f in fields(node)
    ] + [("train.offload_dir", cfg.train.offload_dir)]
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
