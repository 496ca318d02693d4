"""Compile kernels/' FP8 GEMM for one architecture into a build cache (trainflow.fp8.cache); no GPU needed.

    python -m trainflow.fp8 --arch sm90 runs/default/kernels

Default arch: the visible GPU's; default cache: $TRAINFLOW_KERNEL_CACHE, else ~/.cache/trainflow/kernels.

Ranks then load the build from that cache (trainflow.fp8.kernels.load_backend) and never compile. The build_kernels
stage and containers/trainflow.def run the same build.
"""

import argparse

import torch

from trainflow.fp8.build import build_blocker, build_extension
from trainflow.fp8.cache import cache_folder
from trainflow.fp8.kernels import KERNEL_BUILDS

ARCHES = {build.arch: capability for capability, build in KERNEL_BUILDS.items()}
ap = argparse.ArgumentParser(prog="python -m trainflow.fp8", description=__doc__.splitlines()[0])
ap.add_argument("--arch", choices=sorted(ARCHES), help="the kernel's architecture (default: the visible GPU's)")
ap.add_argument("cache", nargs="?", default="", help="the build cache folder")
args = ap.parse_args()
if args.arch is None and not torch.cuda.is_available():
    raise SystemExit("python -m trainflow.fp8: no CUDA device here to take the architecture from: pass --arch sm90")
if blocker := build_blocker():
    raise SystemExit(f"python -m trainflow.fp8: cannot compile: {blocker}")
capability = ARCHES[args.arch] if args.arch else torch.cuda.get_device_capability()
build, library, what = build_extension(capability, cache_folder(args.cache), verbose=True)
print(f"{library}: {build.source} for {build.gencode}, {what}")
