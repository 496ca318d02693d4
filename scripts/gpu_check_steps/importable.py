"""scripts/gpu_check.sh's wheels step, after the install: every module trainflow and the check need is importable.

python scripts/gpu_check_steps/importable.py run|stand_in     # exit 2 naming what is not
"""

import importlib.util
import sys

NEEDED = ("hydra", "omegaconf", "submitit", "crc32c", "zstandard", "cutlass_library", "pynvml", "yaml", "torch")
BUILD = ("ninja",)  # torch's extension builder: the build step's only, which --stand-in replaces
needed = NEEDED + (BUILD if sys.argv[1:] == ["run"] else ())
missing = [name for name in needed if importlib.util.find_spec(name) is None]
if missing:
    print(f"gpu_check: not importable after installing the carried wheels: {', '.join(missing)}")
    sys.exit(2)
print(f"all importable: {', '.join(needed)}")
