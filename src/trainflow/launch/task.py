"""What each task of a job does first: mark where it runs, join the default process group.

with distributed_task(cfg.cluster.runtime) as (rank, world_size, device, marker): ...   # inside a submitit task
"""

from __future__ import annotations

import contextlib
import datetime
import logging.config
import os
import time
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING

import submitit
import yaml
from submitit.core.utils import JobPaths

from trainflow.atomic import write_json
from trainflow.config import CONF_DIR, RuntimeConfig
from trainflow.energy.node import hostname
from trainflow.errors import TrainflowError

if TYPE_CHECKING:
    import torch


def task_marker(paths: JobPaths) -> Path:
    """The task's marker: its rank, host, pid and start, then when its code ended (written by marked_task)."""
    return paths.folder / f"{paths.job_id}_{paths.task_id}_task.json"


@contextlib.contextmanager
def marked_task() -> Iterator[dict]:
    """Record in this task's marker where it runs and, when the block ends (returning or raising), that its code
    ended: a rank of a failed job whose marker lacks the end died abruptly (a signal, os._exit, the OOM killer). A
    raise records whether it was one of trainflow's own errors (launch.restart does not retry those). The block may
    add facts to the dict it is given (the step a training rank was at)."""
    env = submitit.JobEnvironment()
    record = {"rank": env.global_rank, "host": hostname(), "pid": os.getpid(), "started": time.time()}
    write_json(task_marker(env.paths), record)
    try:
        yield record
    except BaseException as err:
        record.update(error=type(err).__name__, expected=isinstance(err, TrainflowError))
        raise
    finally:
        write_json(task_marker(env.paths), {**record, "ended": time.time()})


def configure_logging() -> None:
    """The stages' log lines in a task too: Hydra's job_logging config of the stage process, applied here."""
    logging.config.dictConfig(yaml.safe_load((CONF_DIR / "hydra/job_logging/trainflow.yaml").read_text()))


@contextlib.contextmanager
def distributed_task(runtime: RuntimeConfig) -> Iterator[tuple[int, int, torch.device, dict]]:
    """Rank, world size and device of this task inside the default process group, in a marked task (and the
    marker's facts, which the block may add to)."""
    # Imported here, not at the top: the local controller (`python -m trainflow.launch`) imports this package
    # and would wait 3 s for torch.
    import torch
    import torch.distributed as dist

    configure_logging()
    with marked_task() as marker:
        os.environ.update(runtime.env)
        env = submitit.helpers.TorchDistributedEnvironment().export(set_cuda_visible_devices=False)
        if runtime.device == "cuda":
            device = torch.device("cuda", env.local_rank)
            torch.cuda.set_device(device)
        else:
            device = torch.device("cpu")
        backend = runtime.backend
        dist.init_process_group(
            backend=backend,
            timeout=datetime.timedelta(seconds=runtime.collective_timeout_s),
            device_id=device if backend == "nccl" else None,
        )
        try:
            yield env.rank, env.world_size, device, marker
        finally:
            dist.destroy_process_group()
