"""The one-pass FP8 casts (trainflow.fp8.fused) on CPU: the Triton kernel under Triton's interpreter against the
reference, the kernel compiled ahead of time for sm_90a and its SASS checked, and Float8Linear's one-pass path
(delayed, history usable) equal bit for bit to the path that takes the amax first.

    .venv/bin/python -m pytest tests/unit/test_fp8_fused.py -q -rs

Triton's interpreter runs the kernel's every step on the CPU except the last conversion, which it emulates with
rounding unlike the GPU's (it rounds 84 to 88 in e4m3, where round-to-nearest-even gives 80): so the interpreted
kernel writes fp32 here (its clamped values, the same code with an fp32 output pointer), held exactly to the
reference's values before the cast, and the conversion itself is held to the SASS: F2FP.SATFINITE to E4M3 / E5M2,
the hardware's round-to-nearest-even with saturation, as torch's cast rounds. Skipped without Triton (the test
extra pins it), or for the SASS without the cuobjdump wheel.
"""

from __future__ import annotations

import importlib.util
import os
import re
import subprocess
import sys

import pytest
import torch

from tests.conftest import REPO
from trainflow.fp8 import fused
from trainflow.fp8.cast import E4M3, E5M2, fp8_max
from trainflow.fp8.linear import Float8Linear, sync_amax_history
from trainflow.fp8.sass import find_cuobjdump

HAS_TRITON = importlib.util.find_spec("triton") is not None
needs_triton = pytest.mark.skipif(not HAS_TRITON, reason="Triton is not installed (pip install -e '.[test]' pins it)")
SHAPES = [(37, 70), (64, 64), (130, 260), (1, 129), (200, 1)]


def sample(rows: int, cols: int, dtype: torch.dtype, seed: int) -> torch.Tensor:
    """Values over many binades, some beyond the scaled range (saturation), one NaN."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(rows, cols, generator=g) * torch.exp2(torch.randint(-8, 8, (rows, cols), generator=g).float())
    x[rows // 2, cols // 2] = float("nan")
    return x.to(dtype)


def interpreted_case(rows: int, cols: int, in_dtype: torch.dtype, fp8: torch.dtype) -> list[str]:
    """The kernel under the interpreter (this process must have started with TRITON_INTERPRET=1) on one shape, against
    the reference's values before the cast; what differed, in words ([]: nothing)."""
    kernel, bad = fused.triton_kernel(), []
    x = sample(rows, cols, in_dtype, seed=rows * cols)
    scale, grid = torch.tensor([3.0]), (-(-rows // fused.TILE), -(-cols // fused.TILE))
    expected = (x.float() * scale).clamp(-fp8_max(fp8), fp8_max(fp8))  # the reference's values before the cast
    for nan in (True, False):
        q, qt, amax = torch.empty(rows, cols), torch.empty(cols, rows), torch.tensor([0.5])
        kernel[grid](x, q, qt, scale, amax, rows, cols, x.stride(0), fp8_max(fp8), fused.TILE)
        if not torch.allclose(q, expected, equal_nan=True, rtol=0, atol=0):
            bad.append(f"{rows}x{cols} {in_dtype}: values differ by up to {(q - expected).abs().nan_to_num().max()}")
        if not torch.allclose(qt, expected.t(), equal_nan=True, rtol=0, atol=0):
            bad.append(f"{rows}x{cols} {in_dtype}: the transpose differs")
        want = float("nan") if nan else max(0.5, x.float().abs().max().item())
        if not (amax.isnan().item() if nan else amax.item() == want):
            bad.append(f"{rows}x{cols} {in_dtype}: amax {amax.item()}, not {want} (nan in x: {nan})")
        x = x.nan_to_num(nan=1.0)
        expected = expected.nan_to_num(nan=3.0)
    return bad


@needs_triton
def test_the_kernel_reads_scales_clamps_transposes_and_records_the_amax_as_the_reference():
    """Each shape (tails of the 64 x 64 tile, one row, one column), bf16 and fp32 in, e4m3 and e5m2 limits, with a
    NaN and without, in one process started under the interpreter (Triton reads TRITON_INTERPRET at import)."""
    cases = [
        (*shape, in_dtype, fp8) for shape in SHAPES for in_dtype, fp8 in [(torch.bfloat16, E4M3), (torch.float32, E5M2)]
    ]
    code = (
        "import sys, torch; from tests.unit.test_fp8_fused import interpreted_case as c; "
        f"bad = [b for r, k, i, f in {[(r, k, str(i), str(f)) for r, k, i, f in cases]!r} "
        "for b in c(r, k, getattr(torch, i.split('.')[1]), getattr(torch, f.split('.')[1]))]; "
        "print(bad); sys.exit(1 if bad else 0)"
    )
    env = {**os.environ, "TRITON_INTERPRET": "1", "PYTHONPATH": os.pathsep.join([str(REPO), *sys.path])}
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, cwd=REPO, timeout=300)
    assert done.returncode == 0, done.stdout + done.stderr[-3000:]


def test_the_reference_casts_as_quantise_does_and_records_the_larger_amax():
    x = sample(37, 70, torch.bfloat16, seed=1)
    x[18, 35] = 2.0
    record = torch.tensor([1e6])
    q, qt = fused.reference_cast_pair(x, torch.tensor(2.0), E4M3, record)
    expected = (x.float() * 2).clamp(-448, 448).to(E4M3)
    assert torch.equal(q.view(torch.uint8), expected.view(torch.uint8)) and torch.equal(qt, q.t())
    assert record.item() == 1e6  # a larger earlier amax stays
    record = torch.tensor([0.0])
    fused.cast_pair(x.float().nan_to_num(), torch.tensor(2.0), E4M3, record)  # CPU: the reference
    assert record.item() == x.float().nan_to_num().abs().max().item()


def test_float8_linear_s_one_pass_path_equals_the_amax_first_path_bit_for_bit():
    torch.manual_seed(0)
    layers = [Float8Linear(64, 48, bias=False, recipe="delayed", history_len=4) for _ in range(2)]
    layers[1].load_state_dict(layers[0].state_dict())
    x = torch.randn(3, 5, 64)
    for step in range(3):  # step 0 fills the history; then the one-pass path runs where it is usable
        outputs = []
        for layer, one_pass in zip(layers, (True, False)):
            layer.weight.grad = None
            xi = x.clone().requires_grad_()
            y = layer(xi)
            (y * torch.linspace(-1, 1, 48)).sum().backward()
            outputs.append((y.detach(), xi.grad, layer.weight.grad, layer.amax_pending.clone()))
            sync_amax_history([layer], None)
            layer.history_positive = layer.history_positive and one_pass  # the second never takes the one pass
        assert layers[0].history_positive and not layers[1].history_positive
        for a, b in zip(*outputs):
            assert torch.equal(a, b), f"step {step}: {a} != {b}"
    assert torch.equal(layers[0].amax_history, layers[1].amax_history)


CUOBJDUMP = find_cuobjdump()
THREADS = 128  # Triton's default 4 warps
WIDTH = {"U8": 1, "S8": 1, "U16": 2, "S16": 2, "64": 8, "128": 16}  # bytes by an LDG / STG's last suffix; else 4


def global_bytes(opcodes: list[str]) -> int:
    """The bytes one thread moves through these global loads or stores."""
    return sum(WIDTH.get(op.rsplit(".", 1)[-1], 4) for op in opcodes)


@needs_triton
@pytest.mark.skipif(CUOBJDUMP is None, reason="the nvidia-cuda-cuobjdump/nvdisasm wheels are not installed")
@pytest.mark.parametrize(("fp8", "name", "mnemonic"), [(E4M3, "fp8e4nv", "E4M3"), (E5M2, "fp8e5", "E5M2")])
def test_the_kernel_compiles_for_sm_90a_to_one_read_and_hardware_fp8_conversion(tmp_path, fp8, name, mnemonic):
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    fused.triton_kernel.cache_clear()
    kernel = fused.triton_kernel()
    signature = {"x": "*bf16", "q": f"*{name}", "qt": f"*{name}", "scale": "*fp32", "amax": "*fp32", "rows": "i32",
                 "cols": "i32", "row_stride": "i32", "fp8_max": "constexpr", "tile": "constexpr"}  # fmt: skip
    source = ASTSource(fn=kernel, signature=signature, constexprs={"fp8_max": fp8_max(fp8), "tile": fused.TILE})
    compiled = triton.compile(source, target=GPUTarget("cuda", 90, 32))
    (tmp_path / "cast.cubin").write_bytes(compiled.asm["cubin"])
    sass = subprocess.run([str(CUOBJDUMP), "--dump-sass", str(tmp_path / "cast.cubin")], capture_output=True,
                          text=True, check=True).stdout  # fmt: skip
    opcodes = re.findall(r"^\s*/\*[0-9a-f]+\*/\s+(?:@!?U?P\w+\s+)?([A-Z0-9_.]+)", sass, flags=re.M)
    converts = [op for op in opcodes if op.startswith("F2FP")]
    assert converts and all(op.startswith(f"F2FP.SATFINITE.{mnemonic}.F32") for op in converts), sorted(set(converts))
    # The tile is read once: every global load of the kernel together brings its 64 x 64 bf16 values and the scale.
    loads, stores = [op for op in opcodes if op.startswith("LDG")], [op for op in opcodes if op.startswith("STG")]
    assert global_bytes(loads) * THREADS == fused.TILE**2 * 2 + 4 * THREADS, loads  # and each thread's scale
    assert global_bytes(stores) * THREADS == 2 * fused.TILE**2, f"q and its transpose, a byte a value: {stores}"
    atomics = [op for op in opcodes if op.startswith(("REDG", "ATOMG", "RED.", "ATOM."))]
    assert len(atomics) >= 1 and not any("HMMA" in op or "F2FP.F16" in op for op in opcodes), atomics
