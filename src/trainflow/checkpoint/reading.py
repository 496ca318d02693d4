"""What trainflow's two readers share: checkpoint.reader's InPlaceReader of DCP checkpoints and checkpoint.hf_reader's
HfReader of Hugging Face folders. A load plan is read file by file, files in parallel, each front to back; an item
whose bytes lie in the file as its destination holds them is read straight into the destination (read_into), and the
rest go through torch's own reader of that format.

    python -m pytest tests/unit/test_checkpoint_io.py tests/unit/test_hf_import.py -k "in_place or bitwise"
"""

from __future__ import annotations

import io
import os
from abc import ABC, abstractmethod
from concurrent.futures import ThreadPoolExecutor

import torch
from torch.distributed.checkpoint.planner import LoadPlan, LoadPlanner, ReadItem
from torch.futures import Future

from trainflow.errors import TrainflowError


class ShortReadError(TrainflowError):
    """A file that ended before the bytes its index says it holds."""


def read_into(f: io.RawIOBase | io.BufferedIOBase, into: torch.Tensor, *, name: str) -> None:
    """Fill the contiguous CPU tensor `into` with the next `into.nbytes` bytes of `f`, read into its memory; a file
    that ends first is one ShortReadError naming the file and `name`, the tensor it ended in."""
    view, done = memoryview(into.reshape(-1).view(torch.uint8).numpy()), 0
    while done < len(view) and (n := f.readinto(view[done:])):
        done += n
    if done < len(view):
        raise ShortReadError(
            f"{f.name} ends inside {name} ({done} of {len(view)} bytes read): it was truncated or changed while it "
            "was read"
        )


class HeldFile(io.RawIOBase):
    """A file's bytes held in memory (`data`), read as the file `name` would be: what checkpoint.single_read parses
    once a file was read, or received from the rank that read it, without copying it into a BytesIO."""

    def __init__(self, name: str, data: memoryview) -> None:
        super().__init__()
        self.name, self.data, self.pos = name, data, 0

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def readinto(self, b) -> int:  # noqa: ANN001 (any writable buffer)
        n = max(0, min(len(b), len(self.data) - self.pos))
        memoryview(b).cast("B")[:n] = self.data[self.pos : self.pos + n]
        self.pos += n
        return n

    def seek(self, offset: int, whence: int = io.SEEK_SET) -> int:
        self.pos = {io.SEEK_SET: 0, io.SEEK_CUR: self.pos, io.SEEK_END: len(self.data)}[whence] + offset
        return self.pos

    def tell(self) -> int:
        return self.pos


class InPlaceReading(ABC):
    """Mixed in before a torch StorageReader: its read_data, reading each item in place where `read_in_place` can
    and the rest through the reader's own read_data, a file at a time. `thread_count` files are read at once."""

    thread_count: int

    @abstractmethod
    def item_file(self, item: ReadItem) -> str:
        """The path of the file holding `item`."""

    @abstractmethod
    def item_offset(self, item: ReadItem) -> int:
        """Where `item`'s bytes begin in its file (items are read in this order)."""

    @abstractmethod
    def read_in_place(self, f: io.BufferedReader, item: ReadItem, planner: LoadPlanner) -> bool:
        """Read `item` from `f` straight into its destination and commit it; False where it cannot be."""

    def read_data(self, plan: LoadPlan, planner: LoadPlanner) -> Future[None]:
        per_file: dict[str, list[ReadItem]] = {}
        for item in plan.items:
            per_file.setdefault(self.item_file(item), []).append(item)
        with ThreadPoolExecutor(max_workers=max(1, min(self.thread_count, len(per_file)))) as pool:
            list(pool.map(lambda kv: self.read_file(*kv, planner), per_file.items()))
        done: Future[None] = Future()
        done.set_result(None)
        return done

    def read_file(self, path: str, items: list[ReadItem], planner: LoadPlanner) -> None:
        with open(path, "rb") as f:
            # Items are read in file order, but a DCP record's zip directory sits after its data, which the kernel's
            # readahead heuristic takes for random access without this hint.
            os.posix_fadvise(f.fileno(), 0, 0, os.POSIX_FADV_SEQUENTIAL)
            rest = [item for item in sorted(items, key=self.item_offset) if not self.read_in_place(f, item, planner)]
        if rest:
            super().read_data(LoadPlan(rest), planner).wait()  # type: ignore[misc]
