"""Hugging Face import speed: io.init_from's load (trainflow.checkpoint.hf_reader.load_hf) of a safetensors folder into
a model, against a plain read of the same files' bytes, and the export's memory against the model's size.

    python benchmarks/hf_import.py [--quick] [--dir /tmp]

Goal (issue 27): the import reads at >= 0.8x the raw read of the same safetensors files, cold (the page cache
dropped before each, as a first import reads from disk). Judged against the stricter baseline, a plain read of the
files' bytes into memory (the faster of one and two streams), for both folders; `passed` needs both. bf16 weights
land in fp32 parameters, twice the file's bytes written (widened by numpy's 16-bit shift), so on this 2-core
machine the bf16 import is bound by that CPU work where the raw read is bound by the disk.

The folder is a 4-layer Llama of d=1024 and a 16k vocabulary (81 M parameters: 326 MB in fp32, 163 MB in bf16, as
Meta publishes its weights), cut into ~100 MB shards with their index, as transformers writes them. The raw read
reads each file with one unbuffered readinto into a buffer allocated (and touched) before the clock starts; the
import fills a model built before the clock starts (as the trainer's is), through DCP and the checked reader,
converting bf16 into the fp32 parameters. Both count the files' bytes. Before each timed read every file is fsynced
and dropped from the page cache (posix_fadvise DONTNEED); a VM's host may still cache the disk below us. Rounds
alternate which side goes first, the first is not recorded, and each ratio is the median of the per-round ratios.
`warm` repeats both without dropping the cache. `safetensors_load_file` is safetensors.torch.load_file with every
tensor touched (a copy), the library's own read, for reference.

Export memory: a subprocess exports a trainflow checkpoint of the same model (fp32, 326 MB) in 50 MB shards and
reports its peak resident memory growth (VmHWM) over the model's bytes: streamed, it stays near one shard.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import torch
from _common import bench_model, drop_cache, emit, median
from safetensors.torch import load_file

from trainflow.checkpoint.hf_reader import load_hf
from trainflow.hf.llama import hf_config, hf_name, parameter_shapes
from trainflow.hf.write import plan_shards, write_folder
from trainflow.model import Llama

GOAL = 0.8
MODEL = {"vocab_size": 16_000, "n_layers": 4, "n_heads": 8, "dim": 1024, "seq_len": 256}
SHARD_BYTES = 100_000_000
EXPORT_SHARD_BYTES = 50_000_000
QUICK = 4
"""--quick divides the model's width and vocabulary by this and the shards by its square: 21 MB, several shards."""


def make_folder(out: Path, m, dtype: torch.dtype, shard_bytes: int) -> list[Path]:
    shapes, g = parameter_shapes(m), torch.Generator().manual_seed(0)
    itemsize = torch.empty(0, dtype=dtype).element_size()

    def read(names: list[str]) -> dict[str, torch.Tensor]:
        return {hf_name(n): (torch.randn(shapes[n], generator=g) * 0.02).to(dtype) for n in names}

    write_folder(
        out, {"config.json": json.dumps(hf_config(m, None))}, plan_shards(shapes, shard_bytes * 4 // itemsize), read
    )
    return sorted(out.glob("*.safetensors"))


def raw_read(files: list[Path], buffers: list[memoryview], streams: int) -> float:
    """Read every file into its buffer with unbuffered readinto, `streams` files at a time."""

    def read(pair: tuple[Path, memoryview]) -> None:
        with open(pair[0], "rb", buffering=0) as raw:
            done = 0
            while done < len(pair[1]) and (n := raw.readinto(pair[1][done:])):
                done += n

    start = time.perf_counter()
    with ThreadPoolExecutor(streams) as pool:
        list(pool.map(read, zip(files, buffers)))
    return time.perf_counter() - start


def library_read(files: list[Path]) -> float:
    start = time.perf_counter()
    for f in files:
        tensors = [t.clone() for t in load_file(f).values()]
        del tensors
    return time.perf_counter() - start


def rounds(folder: Path, files: list[Path], m, n: int) -> dict:
    model, buffers = Llama(m), [memoryview(bytearray(f.stat().st_size)) for f in files]
    for b in buffers:
        b[:] = bytes(len(b))  # touched before any clock: both sides write into memory that exists
    nbytes = sum(f.stat().st_size for f in files)
    cold, warm, library, resident = [], [], [], []
    for r in range(n + 1):
        sides = {}
        order = ["import", "raw_1_stream", "raw_2_streams"]
        for side in order[r % 3 :] + order[: r % 3]:  # each side goes first in turn
            resident.append(drop_cache(files))
            sides[side] = timed_import(folder, model, m) if side == "import" else raw_read(files, buffers, int(side[4]))
        drop_cache(files)
        lib = library_read(files)
        warm_sides = {"raw_2_streams": raw_read(files, buffers, 2), "import": timed_import(folder, model, m)}
        if r:  # the first round warms the process up
            cold.append(sides | {"safetensors_load_file": lib})
            warm.append(warm_sides)
            library.append(lib)
    gbps = lambda seconds: nbytes / median(seconds) / 1e9  # noqa: E731
    # The goal's baseline is the faster raw read of each round (this VM's disk rewards two readers).
    return {
        "bytes": nbytes,
        "files": len(files),
        "cold_import_over_raw": median([min(s["raw_1_stream"], s["raw_2_streams"]) / s["import"] for s in cold]),
        "warm_import_over_raw": median([s["raw_2_streams"] / s["import"] for s in warm]),
        "cold_gb_per_s": {k: gbps([s[k] for s in cold]) for k in order},
        "warm_gb_per_s": {k: gbps([s[k] for s in warm]) for k in ("import", "raw_2_streams")},
        "safetensors_load_file_cold_gb_per_s": gbps(library),
        "cold_import_over_safetensors_load_file": median([s["safetensors_load_file"] / s["import"] for s in cold]),
        "cache_resident_after_drop": max(resident),
        "rounds": len(cold),
    }


def timed_import(folder: Path, model: Llama, m) -> float:
    start = time.perf_counter()
    load_hf(folder, [model], m)
    return time.perf_counter() - start


EXPORT_SCRIPT = """
import json, sys
from pathlib import Path
sys.path.insert(0, sys.argv[3])
from _common import bench_model
m = bench_model(**json.loads(sys.argv[4]))
def status(key):  # kB; VmHWM is the peak of this process
    return int(next(line for line in open("/proc/self/status") if line.startswith(key)).split()[1])
if sys.argv[5] == "save":  # a checkpoint of the model as the trainer writes its model (DCP, a manifest)
    import torch, torch.distributed.checkpoint as dcp
    from trainflow.checkpoint.folders import step_dir
    from trainflow.checkpoint.manifest import Provenance, write_manifest
    from trainflow.hf.llama import parameter_shapes
    step = step_dir(sys.argv[1], 1)
    state = {"model": {k: torch.randn(s) * 0.02 for k, s in parameter_shapes(m).items()}}
    dcp.save(state, checkpoint_id=step, no_dist=True)
    write_manifest(step, world_size=1, step=1, provenance=Provenance(model=m))
else:  # in a process of its own, so its peak is the export's
    from trainflow.export import export
    before = status("VmRSS")
    export(Path(sys.argv[1]), Path(sys.argv[2]), max_shard_bytes=int(sys.argv[6]))
    print(json.dumps({"grew_mb": (status("VmHWM") - before) / 1024}))
"""


def export_memory(tmp: Path, shape: dict, shard_bytes: int) -> dict:
    import subprocess

    here, m = str(Path(__file__).parent), bench_model(**shape)
    args = [sys.executable, "-c", EXPORT_SCRIPT, str(tmp / "ckpt"), str(tmp / "exported"), here, json.dumps(shape)]
    subprocess.run([*args, "save"], capture_output=True, text=True, check=True)
    out = subprocess.run([*args, "export", str(shard_bytes)], capture_output=True, text=True, check=True).stdout
    grew = json.loads(out.splitlines()[-1])["grew_mb"]
    model_mb = 4 * sum(torch.Size(s).numel() for s in parameter_shapes(m).values()) / 2**20
    return {
        "model_mb": model_mb,
        "shard_mb": shard_bytes / 2**20,
        "peak_growth_mb": grew,
        "growth_over_model": grew / model_mb,
    }


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument(
        "--quick",
        action="store_true",
        help=f"a model of 21 MB instead of 326 (width and vocabulary / {QUICK}, shards / {QUICK**2}), 1 recorded round "
        "instead of 7",
    )
    ap.add_argument("--dir", default=None)
    args = ap.parse_args()
    shape, shard_bytes, export_shard_bytes, n = MODEL, SHARD_BYTES, EXPORT_SHARD_BYTES, 7
    if args.quick:
        shape = MODEL | {"vocab_size": MODEL["vocab_size"] // QUICK, "dim": MODEL["dim"] // QUICK}
        shard_bytes, export_shard_bytes, n = SHARD_BYTES // QUICK**2, EXPORT_SHARD_BYTES // QUICK**2, 1
    m = bench_model(**shape)
    with tempfile.TemporaryDirectory(dir=args.dir) as tmp:
        tmp = Path(tmp)
        results: dict = {"benchmark": "hf_import"}
        for name, dtype in (("fp32", torch.float32), ("bf16", torch.bfloat16)):
            files = make_folder(tmp / name, m, dtype, shard_bytes)
            results[name] = rounds(tmp / name, files, m, n)
        results["export_memory"] = export_memory(tmp, shape, export_shard_bytes)
    results["goal"] = GOAL
    results["passed"] = all(results[k]["cold_import_over_raw"] >= GOAL for k in ("fp32", "bf16"))
    emit(results)


if __name__ == "__main__":
    main()
