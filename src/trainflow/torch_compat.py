"""What differs across the supported torch releases, 2.11 to 2.14 (pyproject.toml's range), in one place.

    python -c "from trainflow.torch_compat import TORCH; print(TORCH)"

Each difference was found by running the unit and distributed tests under every release of the range; the
losses are bitwise identical across them with these shims (CI reruns a subset under the oldest: scripts/test.sh).
The ones that need no version test stay where they are used, with a comment: a pipeline's first stage gets
contiguous inputs (2.11 checks their strides; parallel.runtime), and checkpoint.reader keeps read_metadata's error
(2.11's dcp.load drops it).
"""

from __future__ import annotations

import torch

SUPPORTED = ((2, 11), (2, 14))
"""The oldest and newest torch (major, minor) trainflow is tested on."""
TORCH = tuple(int(p) for p in torch.__version__.split("+")[0].split(".")[:2])
OLD_PIPELINE = TORCH < (2, 12)
"""Before 2.12 a pipeline stage sizes its receive buffers once, on the schedule's first call, and sets their
requires_grad only if that call trains; 2.12+ set it on every call (PipelineStage._retrieve_recv_activations)."""


def rearm_recv_grads(schedule: object) -> None:
    """After schedule.eval(): give the stages' receive buffers back their requires_grad. On torch < 2.12 an eval
    before the first step (the trainer evaluates at step 0) leaves them without, and every later step() then fails
    in get_bwd_send_ops ("has gradients None and is expecting to send gradients to stage ..."). Only there: on 2.13
    touching them raises PipeliningMetadataError on DTensor buffers."""
    if not OLD_PIPELINE:
        return
    for stage in getattr(schedule, "_stages", None) or [schedule._stage]:
        for infos in stage.args_recv_info.values():
            for info in infos:
                buf = getattr(info, "buffer", None)  # _RecvInfo; the first stage's _RootArgPlaceholder has none
                if isinstance(buf, torch.Tensor) and buf.is_floating_point():
                    buf.requires_grad_(True)


def record_size(zipped: object, name: str, *, numel: int, itemsize: int) -> int:
    """Bytes of record `name` of a torch zip file (a PyTorchFileReader): get_record_size on torch 2.13+; before, the
    storage's own size (the pickle's numel x itemsize), which is what torch.save wrote there."""
    size_of = getattr(zipped, "get_record_size", None)
    return size_of(name) if size_of is not None else numel * itemsize
