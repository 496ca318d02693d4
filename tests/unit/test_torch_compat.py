"""The supported torch range and the shims of trainflow.torch_compat, on whichever torch runs the tests (CI runs this
file under 2.13 and again under 2.11: scripts/test.sh)."""

from __future__ import annotations

import io
import os
import re
import subprocess
import sys
import tomllib

import pytest
import torch
from torch.distributed.pipelining.stage import _RecvInfo

from tests.conftest import REPO
from trainflow import torch_compat


def test_pyproject_declares_the_supported_range_and_this_torch_is_in_it():
    deps = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["dependencies"]
    (pin,) = [d for d in deps if re.match(r"torch\b", d)]
    (low, high) = torch_compat.SUPPORTED
    assert pin == f"torch>={low[0]}.{low[1]},<{high[0]}.{high[1] + 1}", pin
    assert low <= torch_compat.TORCH <= high, torch.__version__


def test_record_size_falls_back_to_the_storage_s_bytes_where_torch_lacks_get_record_size():
    buf = io.BytesIO()
    torch.save(torch.arange(6, dtype=torch.float64), buf)
    zipped = torch._C.PyTorchFileReader(io.BytesIO(buf.getvalue()))
    record = "data/0"  # the tensor's one storage, as checkpoint.tensor_record names it

    class Older:  # torch < 2.13's reader: everything but get_record_size
        def __getattr__(self, attr):
            if attr == "get_record_size":
                raise AttributeError(attr)
            return getattr(zipped, attr)

    assert torch_compat.record_size(Older(), record, numel=6, itemsize=8) == 48
    if hasattr(zipped, "get_record_size"):
        assert torch_compat.record_size(zipped, record, numel=0, itemsize=0) == 48  # the file's own record


class _Stage:
    def __init__(self, buffers):
        self.args_recv_info = {0: tuple(_recv(b) for b in buffers)}


def _recv(buffer):
    info = object.__new__(_RecvInfo)
    info.buffer = buffer
    return info


def test_recv_buffers_are_rearmed_only_on_the_torch_that_needs_it():
    floats, ints = torch.zeros(2), torch.zeros(2, dtype=torch.int64)
    schedule = type("Schedule", (), {"_stages": [_Stage([floats, ints])]})()
    torch_compat.rearm_recv_grads(schedule)
    assert floats.requires_grad is torch_compat.OLD_PIPELINE  # 2.12+ do it themselves; touching it there can raise
    assert not ints.requires_grad


@pytest.mark.parametrize(
    ("version", "message"),
    [
        ("2.10.2", "torch 2.10.2 is outside trainflow's range (torch>=2.11,<2.15)"),
        ("2.15.0+cu130", "torch 2.15.0+cu130 is outside trainflow's range (torch>=2.11,<2.15)"),
        (None, "cannot import torch; install a torch of pyproject.toml's range first"),
    ],
)
def test_system_torch_bootstrap_refuses_an_environment_without_a_supported_torch(tmp_path, version, message):
    """bootstrap.sh --system-torch stops in one line before pip runs (a fake torch on PYTHONPATH stands for one)."""
    if version:
        (tmp_path / "torch").mkdir()
        (tmp_path / "torch/__init__.py").write_text(f"__version__ = {version!r}\n")
    env = {**os.environ, "PYTHON": sys.executable, "PYTHONPATH": str(tmp_path), "PYTHONNOUSERSITE": "1"}
    if not version:
        env["PYTHON"] = str(tmp_path / "python")  # a python whose torch import fails
        (tmp_path / "python").write_text(f'#!/bin/sh\nexec {sys.executable} -c "import sys; sys.exit(1)"\n')
        (tmp_path / "python").chmod(0o755)
    out = subprocess.run(
        ["bash", str(REPO / "scripts/bootstrap.sh"), "--system-torch"], env=env, capture_output=True, text=True
    )
    assert out.returncode == 1 and message in out.stderr and len(out.stderr.strip().splitlines()) == 1, out.stderr
