"""scripts/gpu_check.sh's last act: every step's latest outputs in WORK merged into OUT_DIR/gpu_check.json, and the
evidence copied beside it (at most 8 files in all); prints the summary and exits 1 where a step failed.

    python scripts/gpu_check_steps/merge.py WORK OUT_DIR SECONDS STEP,NAMES,...

OUT_DIR: gpu_check.json; steps.out (every step's stdout, in order, each under a "== NAME" line); tests_gpu.txt
(pytest's -rA output: each test's outcome and every failing test's traceback and captured output); tests_gpu.xml
(junit); build.log (the compile's own log); measured.json (kernels/measured.json with this device's and build's
record replaced: commit it); gpu_check.log is the runner's (every step's stderr). A step that never ran (a
--steps run before any whole one) is listed with exit null.
"""

from __future__ import annotations

import json
import shutil
import sys
import xml.etree.ElementTree as ET
from dataclasses import asdict, dataclass
from pathlib import Path

KERNELS = Path(__file__).resolve().parents[2] / "kernels"

JSON_STEPS = ("environment", "fp8_gemm", "train_steps", "power", "dvfs")  # each prints one JSON document
LAST_LINE_JSON = ("sass",)  # prints one JSON line last


@dataclass(frozen=True)
class StepResult:
    step: str
    exit: int | None
    """The step's exit status (124: over its budget); None: it has not run in this folder."""
    seconds: int | None


def read_json(path: Path, last_line: bool = False) -> dict:
    try:
        text = path.read_text()
        return json.loads(text.strip().splitlines()[-1] if last_line else text)
    except (OSError, ValueError, IndexError) as err:
        return {"unreadable": f"{path.name}: {err}"}


def step_results(work: Path, names: list[str]) -> list[StepResult]:
    results = []
    for name in names:
        path = work / f"{name}.step"
        if path.is_file():
            _, rc, seconds = path.read_text().split()
            results.append(StepResult(name, int(rc), int(seconds)))
        else:
            results.append(StepResult(name, None, None))
    return results


def tests_summary(xml: Path) -> dict:
    """The junit file's counts, and each failed test with the first line of its failure."""
    if not xml.is_file():
        return {"unreadable": f"{xml.name} missing: pytest did not finish"}
    root = ET.parse(xml).getroot()
    suite = root if root.tag == "testsuite" else root.find("testsuite")
    summary = {k: int(suite.get(k, 0)) for k in ("tests", "failures", "errors", "skipped")}
    failed = {}
    for case in suite.iter("testcase"):
        problem = case.find("failure") if case.find("failure") is not None else case.find("error")
        if problem is not None:
            failed[f"{case.get('classname')}::{case.get('name')}"] = (problem.get("message") or "").splitlines()[:1]
    return summary | {"failed": failed}


def merged_measured(record: dict) -> dict:
    """kernels/measured.json with each architecture's record of this device and build key replaced by `record`'s.
    Plain JSON, so the merge needs no torch: tests/unit/test_fp8_kernel_build.py reads the committed file as the
    typed record (trainflow.fp8.measured.Measurements)."""
    path = KERNELS / "measured.json"
    merged = json.loads(path.read_text()) if path.is_file() else {"sm89": [], "sm90": []}
    for arch, new in record.items():
        kept = [r for r in merged[arch] if (r["device"], r["build_key"]) != (new["device"], new["build_key"])]
        merged[arch] = [*kept, new]
    return merged


def main(work: Path, out: Path, total_s: int, names: list[str]) -> int:
    steps = step_results(work, names)
    result: dict = {"seconds": total_s, "steps": [asdict(s) for s in steps]}
    result["passed"] = all(s.exit == 0 for s in steps)
    for name in JSON_STEPS + LAST_LINE_JSON:
        if (work / f"{name}.out").is_file():
            result[name] = read_json(work / f"{name}.out", last_line=name in LAST_LINE_JSON)
    if (work / "build.out").is_file():
        lines = (work / "build.out").read_text().strip().splitlines()
        result["build"] = lines[-1] if lines else ""
        shutil.copyfile(work / "build.out", out / "build.log")
    result["tests_gpu"] = tests_summary(work / "tests_gpu.xml")
    for name, kept in (("tests_gpu.xml", "tests_gpu.xml"), ("tests_gpu.out", "tests_gpu.txt")):
        if (work / name).is_file():
            shutil.copyfile(work / name, out / kept)
    with (out / "steps.out").open("w") as f:
        for s in steps:
            path = work / f"{s.step}.out"
            f.write(f"== {s.step}: exit {s.exit}\n{path.read_text() if path.is_file() else ''}\n")
    if record := result.get("fp8_gemm", {}).get("measured"):
        (out / "measured.json").write_text(json.dumps(merged_measured(record), indent=1) + "\n")
    (out / "gpu_check.json").write_text(json.dumps(result, indent=1) + "\n")
    print(json.dumps({k: result.get(k) for k in ("tests_gpu", "train_steps", "power", "dvfs")}, indent=1)[:4000])
    listed = ", ".join(f"{s.step} exit {s.exit} ({s.seconds} s)" for s in steps)
    print(f"gpu_check: {'passed' if result['passed'] else 'FAILED'} in {total_s} s: {listed}")
    return 0 if result["passed"] else 1


if __name__ == "__main__":
    sys.exit(main(Path(sys.argv[1]), Path(sys.argv[2]), int(sys.argv[3]), sys.argv[4].split(",")))
