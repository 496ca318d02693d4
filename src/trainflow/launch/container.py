"""The container a job's ranks run in, as srun's line says it (cluster.allocation.container).

    python -c "from trainflow.config.cluster import ContainerConfig; from trainflow.launch.container import srun_args; \
        print(srun_args(ContainerConfig(edf='profiles/slurm/alps.toml')))"

- An EDF (CSCS's Container Engine: Enroot images through Pyxis): `srun --environment=<edf> ... python3 -u -m
  submitit.core._submit <folder>`; the EDF holds the image, the mounts and the hooks (aws-ofi-nccl, CXI).
- An Apptainer image: `srun ... apptainer exec [--nv] [--bind b]... <sif> python3 -u -m submitit.core._submit
  <folder>`, the submitit folder bound so the ranks read their job and write their results.
- Neither: the ranks run the submitter's own interpreter (submitit's default), the venv of scripts/bootstrap.sh.

submitit quotes srun's arguments but takes the interpreter as a shell word list; every value here passed config's
CONTAINER_FILE / BIND_MOUNT patterns (no spaces, quotes or `$`) and is quoted again with shlex.
"""

from __future__ import annotations

import shlex
from pathlib import Path

from trainflow.config.cluster import AllocationConfig, ContainerConfig
from trainflow.errors import TrainflowError


def srun_args(container: ContainerConfig) -> list[str]:
    """srun's own arguments for the container: Pyxis's --environment for an EDF."""
    return [f"--environment={container.edf}"] if container.edf else []


def python_command(allocation: AllocationConfig, *, folder: str | Path) -> str | None:
    """The command srun starts in place of the submitter's python (None: that one, submitit's default)."""
    c = allocation.container
    if c.sif:
        gpus = ["--nv"] if allocation.gpus_per_node else []
        binds = [arg for b in [str(Path(folder).resolve()), *c.binds] for arg in ("--bind", b)]
        return shlex.join(["apptainer", "exec", *gpus, *binds, c.sif, c.python])
    if c.edf:
        return shlex.quote(c.python)
    return None


def check_container(container: ContainerConfig) -> None:
    """Before a job is submitted: the image and the EDF a path names exist (an EDF by name lies in the search path
    of the nodes, ~/.edf, which only srun sees)."""
    for key, path in (("sif", container.sif), ("edf", container.edf if "/" in container.edf else "")):
        if path and not Path(path).is_file():
            how = "build it: apptainer build " + path + " containers/trainflow.def" if key == "sif" else "create it"
            raise TrainflowError(f"cluster.allocation.container.{key}({path}) is no file here; {how}")
