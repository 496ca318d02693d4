"""Build kernels/ (the FP8 GEMM) with torch.utils.cpp_extension and load it; run on a GPU node.

    python -m trainflow.fp8

The build is cached (TORCH_EXTENSIONS_DIR, default ~/.cache/torch_extensions), so training ranks that call
`load_backend` afterwards load it instead of compiling.
"""

import torch

from trainflow.fp8.kernels import EXTENSION, build_extension, kernels_folder

if not torch.cuda.is_available():
    raise SystemExit("python -m trainflow.fp8: no CUDA device here (or a CPU build of torch); run it on a GPU node")
build = build_extension(verbose=True)
source = kernels_folder() / build.source
print(f"Built and loaded {EXTENSION}_{build.arch} from {source}: trainflow::fp8_gemm_{build.arch}")
