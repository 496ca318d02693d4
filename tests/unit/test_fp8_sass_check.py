"""trainflow.fp8.sass, which scripts/gpu_check.sh runs on the GPU machine's build: a right build passes, each wrong
one fails naming why (the compiled SASS itself: tests/unit/test_fp8_sass.py)."""

from __future__ import annotations

import pytest

from trainflow.fp8.sass import counts, faults


def kernel(name: str, mma: str, fadds: int = 64, extra: str = "") -> str:
    lines = [f"        /*{i:04x}*/                   FADD R{i % 200}, R1, R2 ;" for i in range(fadds)]
    lines.append(f"        /*1000*/                   {mma} gdesc[UR4], RZ, !UPT ;")
    lines += [f"        /*2000*/                   {extra} ;"] if extra else []
    return f"\t\tFunction : {name}\n" + "\n".join(lines) + "\n"


# The names' parts config_of reads, as CUTLASS's mangled kernel names hold them.
CONFIG_NAMES = {"cooperative": "KernelTmaWarpSpecializedCooperative", "pingpong": "KernelTmaWarpSpecializedPingpong",
                "stream_k": "KernelTmaWarpSpecializedCooperative_StreamKScheduler"}  # fmt: skip


def build(configs=tuple(CONFIG_NAMES), **change) -> str:
    """A build's SASS: 4 kernels per configuration, `change` applied to the last configuration's."""
    names = ["e4m3_f32", "e4m3_bf16", "e5m2_f32", "e5m2_bf16"]
    mmas = ["QGMMA.64x128x32.F32.E4M3.E4M3"] * 2 + ["QGMMA.64x128x32.F32.E5M2.E4M3"] * 2
    text = ""
    for config in configs:
        changed = change if config == configs[-1] else {}
        for n, m in zip(names, mmas):
            name = f"k_{CONFIG_NAMES[config]}_{n}"
            text += kernel(name, changed.get("mma", m), changed.get("fadds", 64), changed.get("extra", ""))
    return text


def test_a_right_build_passes():
    found = counts(build(), "sm90")
    assert faults(found, "sm90") == [] and len(found) == 12
    assert found["k_KernelTmaWarpSpecializedPingpong_e5m2_f32"] == {
        "QGMMA.E4M3.E4M3": 0,
        "QGMMA.E5M2.E4M3": 1,
        "FADD": 64,
        "HMMA": 0,
        "F2FP_unpack": 0,
    }


@pytest.mark.parametrize(
    ("change", "why"),
    [
        ({"fadds": 0}, "0 FADD, under 64 (no fp32 promotion)"),
        ({"extra": "HMMA.16816.F32 R4, R8, R12, R4"}, "1 HMMA and 0 F2FP unpackings (fp16 emulation)"),
        ({"extra": "F2FP.F16.E4M3.UNPACK_B R2, R3"}, "0 HMMA and 1 F2FP unpackings"),
        ({"mma": "HGMMA.64x128x16.F32.BF16"}, "no QGMMA on fp8 operands"),
        ({"mma": "QGMMA.64x128x32.F32.E4M3.E4M3"}, "stream_k: no kernel runs QGMMA on E5M2.E4M3"),
    ],
)
def test_a_wrong_build_fails_naming_why(change, why):
    bad = faults(counts(build(**change), "sm90"), "sm90")
    assert any(why in b for b in bad), bad


def test_a_build_missing_kernels_or_a_configuration_fails():
    assert faults(counts(kernel("only", "QGMMA.64x128x32.F32.E4M3.E4M3"), "sm90"), "sm90")[0].startswith(
        "cooperative: 1 kernels, not 4"
    )
    assert faults(counts(build(("cooperative", "pingpong")), "sm90"), "sm90") == [
        "stream_k: 0 kernels, not 4 (A e4m3/e5m2 x C fp32/bf16)"
    ]
