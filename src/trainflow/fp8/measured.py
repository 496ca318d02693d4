"""kernels/measured.json: the GPU checks' timings of the fp8 kernels, per architecture, device name and build key, and
what they show (which shapes the sm90 kernel won against torch._scaled_mm).

    python -c "from trainflow.fp8.kernels import kernels_folder; from trainflow.fp8.measured import read_measured; \
        print(read_measured(kernels_folder())['sm90'][0].per_shape[3])"

benchmarks/fp8_gemm.py writes one record (its "measured"), scripts/gpu_check.sh merges it into the file by device and
build key, and it is committed from the GPU run (kernels/README.md).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from trainflow.fp8.cache import BuildKey
from trainflow.fp8.dispatch import kernel_shapes
from trainflow.fp8.shapes import SCALED_MM, ShapeTiming
from trainflow.records import Record, read_record

MEASURED = "measured.json"


@dataclass(frozen=True)
class GemmSeconds(Record):
    """Seconds summed over the benchmark's shapes (benchmarks/fp8_gemm.py)."""

    kernel: float
    scaled_mm: float


@dataclass(frozen=True)
class KernelMeasurement(Record):
    """One architecture's last GPU check: kernels/measured.json holds {arch: KernelMeasurement}, the "measured" of
    benchmarks/fp8_gemm.py's output, which scripts/gpu_check.sh writes out."""

    build_key: BuildKey
    """Of the build measured (sources, nvcc flags, nvcc / CUTLASS / torch versions): it holds for that build only."""
    correctness_passed: bool
    device: str
    """torch.cuda.get_device_name(): it holds for that device only."""
    torch: str
    shapes: list[str]
    """The benchmark's shapes the seconds sum over."""
    seconds: GemmSeconds
    """The kernel's: each shape's fastest configuration."""
    per_shape: list[ShapeTiming] = field(default_factory=list)
    """Each shape's seconds per configuration and of torch._scaled_mm (sm90), which the dispatch picks from."""
    measured_on: str | None = None
    """The digest of the build key the figures were measured on, where it is not build_key's: the kernel's sources
    changed since (their split into translation units) and no GPU check has timed this build yet; None: this
    build's own figures."""


@dataclass(frozen=True)
class Measurements(Record):
    """kernels/measured.json: by architecture (KernelBuild.arch), one record per device name and build key."""

    sm89: list[KernelMeasurement]
    sm90: list[KernelMeasurement]

    def by_arch(self) -> dict[str, list[KernelMeasurement]]:
        return {"sm89": self.sm89, "sm90": self.sm90}


def read_measured(folder: Path) -> dict[str, list[KernelMeasurement]]:
    """kernels/measured.json: {arch: the records of its GPU checks}; {} while nothing has been measured. One
    RecordError naming the file and the field where it is not Measurements."""
    path = folder / MEASURED
    if not path.is_file():
        return {}
    return read_record(Measurements, path, rerun="scripts/gpu_check.sh and commit its measured.json").by_arch()


def measured_record(records: list[KernelMeasurement], device: str, key: BuildKey) -> KernelMeasurement | None:
    """The GPU check of this very device (by name: an H200's record holds for no H100 PCIe or GH200) and build."""
    return next((r for r in records if r.device == device and r.build_key == key), None)


def by_measurement(record: KernelMeasurement, source: str) -> tuple[bool, str]:
    """(whether `record` shows the kernel of `source` the fastest on any measured shape; the fact, in words)."""
    if not record.correctness_passed:
        return False, f"{source} failed its GPU check against the reference ({record.device})"
    compared = [t for t in record.per_shape if SCALED_MM in t.seconds]
    if not compared:
        return False, (
            f"kernels/{MEASURED}'s record of {record.device} holds no shape timed against torch._scaled_mm "
            "(scripts/gpu_check.sh records them)"
        )
    wins = kernel_shapes(compared)
    figures = f" (figures of build {record.measured_on}, before this build's sources)" if record.measured_on else ""
    if not wins:
        return False, (
            f"faster than every configuration of {source} on all {len(compared)} measured shapes on "
            f"{record.device}{figures}"
        )
    return True, (
        f"{source} where it measured fastest ({', '.join(wins)}), torch._scaled_mm on the other "
        f"{len(compared) - len(wins)} measured shapes, per GEMM shape on {record.device}{figures}"
    )
