"""scripts/gpu_check.sh's environment step: torch, CUDA, the GPU, nvcc and the fp8 dispatch's choice, as one JSON.

python scripts/gpu_check_steps/environment.py
"""

import json
import subprocess
import sys

import torch

from trainflow.fp8.kernels import backend_reason


def output(cmd: list[str]) -> str:
    try:
        return subprocess.run(cmd, capture_output=True, text=True, timeout=10).stdout.strip()
    except (OSError, subprocess.SubprocessError) as err:
        return f"unavailable: {err}"


if not torch.cuda.is_available():
    sys.exit("gpu_check: torch sees no CUDA device (torch.cuda.is_available() is False)")
query = ["nvidia-smi", "--query-gpu=name,driver_version,clocks.max.sm,power.limit", "--format=csv,noheader"]
json.dump(
    {
        "python": sys.version.split()[0],
        "torch": torch.__version__,
        "torch_cuda": torch.version.cuda,
        "device": torch.cuda.get_device_name(),
        "capability": list(torch.cuda.get_device_capability()),
        "nvidia_smi": output(query),
        "nvcc": output(["nvcc", "--version"]).splitlines()[-1:],
        "fp8_backend_unforced": backend_reason(torch.device("cuda")),
    },
    sys.stdout,
    indent=1,
)
