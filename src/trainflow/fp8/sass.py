"""What a built fp8 kernel's machine code must hold, checked from `cuobjdump --dump-sass`: the claims the kernels
rest on (kernels/README.md), so a wrong build fails instead of running slowly or imprecisely.

    python -m trainflow.fp8.sass sm90 LIBRARY.so     # one JSON line of counts per kernel; exit 1 naming each fault

Per kernel (4 per configuration: A e4m3 / e5m2 x C fp32 / bf16; sm90 has three configurations, told apart by the
CUTLASS schedule and scheduler in the kernel's name): sm90 issues QGMMA (Hopper's fp8 warpgroup MMA), sm89
QMMA.16832 (fp8 mma.sync); at least one FADD per fp32 accumulator of a thread (the promotion of the tensor core's
partial sums; a whole-K accumulation has none); no HMMA and no F2FP.F16.E4M3/E5M2 unpacking (nvcc's fp16 emulation
of fp8 MMA). Per configuration: both operand pairs, E4M3.E4M3 and E5M2.E4M3 (the gradients' GEMMs).
"""

from __future__ import annotations

import importlib.util
import json
import re
import shutil
import subprocess
import sys
from pathlib import Path

MMA = {"sm90": "QGMMA", "sm89": "QMMA.16832"}
CONFIGS = {"sm90": ("cooperative", "pingpong", "stream_k"), "sm89": ("mma_sync",)}
KERNELS_PER_CONFIG = 4
ACCUMULATORS_PER_THREAD = 64
"""fp32 accumulators per thread in every kernel (a warpgroup's 64x128 of C over 128 threads; a warp's 64x32 over
32): each promotion adds every one of them once."""
PAIRS = ("E4M3.E4M3", "E5M2.E4M3")


def find_cuobjdump() -> Path | None:
    """The nvidia-cuda-cuobjdump wheel's binary (beside the nvdisasm wheel's), else the toolkit's on PATH."""
    spec = importlib.util.find_spec("nvidia")
    for root in spec.submodule_search_locations if spec else []:
        if (path := Path(root) / "cu13/bin/cuobjdump").is_file() and (path.parent / "nvdisasm").is_file():
            return path
    found = shutil.which("cuobjdump")
    return Path(found) if found else None


def functions(text: str) -> dict[str, str]:
    """`cuobjdump --dump-sass` output by kernel (mangled name -> its instructions)."""
    parts = re.split(r"^\s*Function : (\S+)$", text, flags=re.M)
    return dict(zip(parts[1::2], parts[2::2]))


def count(opcode: str, sass: str) -> int:
    """Instructions whose opcode starts with `opcode` (e.g. 'QGMMA.64x128x32.F32.E4M3.E4M3', 'FADD')."""
    return len(re.findall(rf"^\s*/\*[0-9a-f]+\*/\s+(?:@!?U?P\w+\s+)?{re.escape(opcode)}[\s.]", sass, flags=re.M))


def config_of(name: str, arch: str) -> str:
    """The configuration a kernel's mangled name shows (its CUTLASS schedule and tile scheduler), one of CONFIGS."""
    if arch == "sm89":
        return "mma_sync"
    if "StreamKScheduler" in name:
        return "stream_k"
    return "pingpong" if "KernelTmaWarpSpecializedPingpong" in name else "cooperative"


def counts(text: str, arch: str) -> dict[str, dict[str, int]]:
    """Per kernel: its MMA instructions by operand pair, FADD, HMMA and fp16 unpacking F2FP."""
    mma = MMA[arch]
    return {
        name: {
            **{
                f"{mma}.{pair}": len(re.findall(rf"\b{re.escape(mma)}[\w.]*\.F32\.{re.escape(pair)}\b", sass))
                for pair in PAIRS
            },
            "FADD": count("FADD", sass),
            "HMMA": count("HMMA", sass),
            "F2FP_unpack": len(re.findall(r"F2FP\.F16\.E[45]M[23]", sass)),
        }
        for name, sass in functions(text).items()
    }


def faults(found: dict[str, dict[str, int]], arch: str) -> list[str]:
    """Each way `found` (counts) breaks the module docstring's rules, in words; [] for a right build."""
    mma, bad = MMA[arch], []
    for config in CONFIGS[arch]:
        kernels = {name: c for name, c in found.items() if config_of(name, arch) == config}
        if len(kernels) != KERNELS_PER_CONFIG:
            bad.append(f"{config}: {len(kernels)} kernels, not {KERNELS_PER_CONFIG} (A e4m3/e5m2 x C fp32/bf16)")
        for pair in PAIRS:
            if kernels and not any(c[f"{mma}.{pair}"] for c in kernels.values()):
                bad.append(f"{config}: no kernel runs {mma} on {pair}")
    for name, c in found.items():
        if not any(c[f"{mma}.{pair}"] for pair in PAIRS):
            bad.append(f"{name}: no {mma} on fp8 operands")
        if c["HMMA"] or c["F2FP_unpack"]:
            bad.append(f"{name}: {c['HMMA']} HMMA and {c['F2FP_unpack']} F2FP unpackings (fp16 emulation)")
        if c["FADD"] < ACCUMULATORS_PER_THREAD:
            bad.append(f"{name}: {c['FADD']} FADD, under {ACCUMULATORS_PER_THREAD} (no fp32 promotion)")
    return bad


def main(argv: list[str]) -> int:
    if len(argv) != 2 or argv[0] not in MMA:
        print(f"usage: python -m trainflow.fp8.sass {{{','.join(MMA)}}} LIBRARY.so", file=sys.stderr)
        return 2
    tool = find_cuobjdump()
    if tool is None:
        print("trainflow.fp8.sass: no cuobjdump (the nvidia-cuda-cuobjdump wheel or the CUDA toolkit)", file=sys.stderr)
        return 1
    text = subprocess.run([str(tool), "--dump-sass", argv[1]], capture_output=True, text=True, check=True).stdout
    found = counts(text, argv[0])
    bad = faults(found, argv[0])
    kernels = {name: {"config": config_of(name, argv[0]), **c} for name, c in found.items()}
    print(json.dumps({"arch": argv[0], "kernels": kernels, "faults": bad}))
    for fault in bad:
        print(f"trainflow.fp8.sass: {argv[1]}: {fault}", file=sys.stderr)
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
