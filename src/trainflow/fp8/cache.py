"""The kernels' build cache: each kernel is compiled once per campaign (the build_kernels stage, a container's build,
or `python -m trainflow.fp8`) into a folder keyed by everything that makes its machine code; ranks only load it.

    python -m trainflow.fp8 --arch sm90 runs/default/kernels     # compile sm_90a's kernel into that cache

A build's folder is `<cache>/<extension>-<key digest>/` and holds the shared library and build.json (BuildRecord:
its BuildKey, host, seconds). The key is the kernel's sources (SHA-256 of the .cu, the binding and the header), nvcc's
flags, and the versions of nvcc, CUTLASS and torch: a change in any of them is another folder, so a rank never loads
a stale build. Ranks call `cached_library`, which never compiles: where the key's folder is missing they are told in
one warning and run torch._scaled_mm (trainflow.fp8.kernels).

Why not torch's own cache (cpp_extension.load in every rank): its lock file has no timeout, so on a shared home
4095 ranks poll one lock while one compiles (1-3 min, 4.3 GB of memory for the CUTLASS unit), and a builder killed
mid-build leaves the lock for every later job to wait on forever. BuildLock names its holder (host, pid, start) and
is taken over once its holder is dead (same host) or it is older than its timeout; the compile itself runs in a
folder private to the builder and is renamed into place whole, so a reader sees a complete build or none.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import re
import shutil
import subprocess
import time
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path

from trainflow.host import hostname
from trainflow.records import Record, RecordError, read_record

CACHE_ENV = "TRAINFLOW_KERNEL_CACHE"
DEFAULT_CACHE = Path.home() / ".cache/trainflow/kernels"
RECORD = "build.json"
LOCK_TIMEOUT_S = 1800.0
"""A build lock older than this is a dead builder's: the CUTLASS unit compiles in 1-3 min on a GPU node."""


@dataclass(frozen=True)
class BuildKey(Record):
    """What makes one kernel's machine code: a build holds for exactly these."""

    extension: str
    sources_sha256: str
    nvcc_flags: list[str]
    nvcc: str
    """nvcc's release line, e.g. 'release 13.0, V13.0.88'; 'none' where no nvcc was found."""
    cutlass: str
    torch: str

    def digest(self) -> str:
        fields = dataclasses.asdict(self)  # not to_json: the document's format is no part of what was built
        return hashlib.sha256(json.dumps(fields, sort_keys=True).encode()).hexdigest()[:16]


@dataclass(frozen=True)
class BuildRecord(Record):
    """build.json of one build folder."""

    key: BuildKey
    library: str
    """The shared library's file name inside the folder."""
    host: str
    seconds: float


@dataclass(frozen=True)
class LockHolder(Record):
    host: str
    pid: int
    started: float
    """time.time() when the lock was taken."""

    def describe(self) -> str:
        return f"{self.host} pid {self.pid} since {time.strftime('%H:%M:%S', time.localtime(self.started))}"


def cache_folder(folder: str | Path = "") -> Path:
    """The build cache: `folder` where given (the run folder's, io.kernel_cache), else $TRAINFLOW_KERNEL_CACHE (a
    container image sets it to its prebuilt cache), else ~/.cache/trainflow/kernels."""
    return Path(folder or os.environ.get(CACHE_ENV) or DEFAULT_CACHE)


def find_library(folder: str | Path, key: BuildKey) -> tuple[Path | None, str]:
    """`key`'s build in the run's cache `folder`, else in $TRAINFLOW_KERNEL_CACHE's (a container image's prebuilt
    one), else in the default: (its library or None, the fact in words, naming every folder looked in)."""
    folders = list(dict.fromkeys(cache_folder(f) for f in (folder, os.environ.get(CACHE_ENV, ""))))
    facts = []
    for cache in folders:
        library, fact = cached_library(cache, key)
        if library is not None:
            return library, fact
        facts.append(fact)
    return None, "; ".join(facts)


def find_nvcc() -> Path | None:
    """nvcc of $CUDA_HOME, else from PATH, else /usr/local/cuda: the one torch's extension builder would use."""
    candidates = [Path(os.environ["CUDA_HOME"]) / "bin/nvcc"] if os.environ.get("CUDA_HOME") else []
    candidates += [Path(p) for p in [shutil.which("nvcc")] if p] + [Path("/usr/local/cuda/bin/nvcc")]
    return next((c for c in candidates if c.is_file()), None)


def nvcc_release(nvcc: Path | None) -> str:
    if nvcc is None:
        return "none"
    try:
        text = subprocess.run([str(nvcc), "--version"], capture_output=True, text=True, timeout=60).stdout
    except (OSError, subprocess.SubprocessError) as err:
        return f"unusable ({type(err).__name__})"
    found = re.search(r"release [^\n]+", text)
    return found.group(0).strip() if found else "unknown"


def cutlass_version() -> str:
    try:
        return metadata.version("nvidia-cutlass")
    except metadata.PackageNotFoundError:
        return "none"


def build_key(extension: str, sources: list[Path], flags: list[str], nvcc: str, torch_version: str) -> BuildKey:
    """The key of a build of `sources` with nvcc `flags` (include paths left out: where the headers lie is not what
    they hold; CUTLASS's version stands for its headers)."""
    digest = hashlib.sha256()
    for path in sources:
        digest.update(path.name.encode() + b"\0" + path.read_bytes())
    kept = [f for i, f in enumerate(flags) if f != "-isystem" and (i == 0 or flags[i - 1] != "-isystem")]
    return BuildKey(extension, digest.hexdigest(), kept, nvcc, cutlass_version(), torch_version)


def build_folder(cache: Path, key: BuildKey) -> Path:
    return cache / f"{key.extension}-{key.digest()}"


def cached_library(cache: Path, key: BuildKey) -> tuple[Path | None, str]:
    """(the shared library of `key`'s build, or None; the fact in words). Never compiles."""
    folder = build_folder(cache, key)
    try:
        record = read_record(BuildRecord, folder / RECORD)
    except RecordError:
        others = sorted(p.name for p in cache.glob(f"{key.extension}-*") if p.is_dir()) if cache.is_dir() else []
        held = f"; it holds builds of other keys only ({', '.join(others)})" if others else ""
        return None, f"{cache} holds no build of {key.extension} for key {key.digest()}{held}"
    if record.key != key or not (folder / record.library).is_file():
        return None, f"{folder} is not a complete build of key {key.digest()} ({RECORD} differs or the library is gone)"
    return folder / record.library, f"built on {record.host} in {record.seconds:.0f} s, key {key.digest()}"


class BuildLock:
    """An exclusive lock file naming its holder; a waiter takes it over once it is stale (module docstring)."""

    def __init__(self, path: Path, timeout_s: float = LOCK_TIMEOUT_S, poll_s: float = 2.0) -> None:
        self.path, self.timeout_s, self.poll_s = path, timeout_s, poll_s
        self.me = LockHolder(hostname(), os.getpid(), 0.0)
        self.taken_over: LockHolder | None = None
        """The stale holder this lock was taken from, if any."""

    def stale(self, holder: LockHolder) -> bool:
        if time.time() - holder.started > self.timeout_s:
            return True
        return holder.host == self.me.host and not _alive(holder.pid)

    def __enter__(self) -> BuildLock:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        while not self._create():
            holder = self._holder()
            if holder is not None and self.stale(holder):
                self._take_over(holder)
            else:
                time.sleep(self.poll_s)
        return self

    def __exit__(self, *exc) -> None:
        if self._holder() == self.me:
            self.path.unlink(missing_ok=True)

    def _create(self) -> bool:
        self.me = LockHolder(self.me.host, self.me.pid, time.time())
        try:
            fd = os.open(self.path, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
        except FileExistsError:
            return False
        with os.fdopen(fd, "w") as f:
            json.dump(self.me.to_json(), f)
        return True

    def _holder(self) -> LockHolder | None:
        """The lock's holder; None while it is being written or was just released (then the next try decides)."""
        try:
            return LockHolder.from_json(json.loads(self.path.read_text()))
        except (OSError, ValueError, RecordError):
            return None

    def _take_over(self, holder: LockHolder) -> None:
        """Move the stale lock aside, atomically: of two waiters that judged it stale, one moves it; should the other
        then move a fresh lock aside (taken meanwhile), it puts that one back."""
        aside = self.path.with_name(f"{self.path.name}.stale.{self.me.host}.{self.me.pid}")
        try:
            os.rename(self.path, aside)
        except FileNotFoundError:
            return
        try:
            moved = LockHolder.from_json(json.loads(aside.read_text()))
        except (OSError, ValueError, RecordError):
            moved = None
        if moved == holder:
            self.taken_over = holder
        else:
            try:
                os.link(aside, self.path)  # back, unless someone has taken the lock since
            except FileExistsError:
                pass
        aside.unlink(missing_ok=True)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True
