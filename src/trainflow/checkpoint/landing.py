"""Where the bytes of a checkpoint item read by another rank land (checkpoint.single_read): straight into the
destination tensor where the saved tensor is that whole contiguous tensor, else the whole record into a buffer of
its own, which the item is then read from as the file would be.

    python -m pytest tests/unit/test_single_read.py

A received byte is written once, by the kernel's copy out of the socket into its final place: no buffer of the
file's size per rank, whose fresh memory this VM's host backs slowly (see benchmarks/checkpoint_load.py), and no
copy from that buffer into the state. The rank that read the file describes its records (checkpoint.tensor_record,
told to the ranks that need the file, checkpoint.agreement), and each receiving rank chooses per item, from that
description and its own destination, which bytes of the file it asks for: the data of a tensor it reads in place, the
whole record otherwise, nothing for a small record, whose bytes came with the description. The bytes come from the
reader, in rounds (checkpoint.exchange_rounds).
"""

from __future__ import annotations

import io
from dataclasses import dataclass

import torch
from torch.distributed.checkpoint.filesystem import _StorageInfo
from torch.distributed.checkpoint.planner import ReadItem

from trainflow.checkpoint.reading import HeldFile
from trainflow.checkpoint.tensor_record import SavedTensor


class HeldRange(HeldFile):
    """Bytes [start, start + len(data)) of the file `name`, held in memory and read at their offsets in that file:
    one record received from the rank that read the file, read by checkpoint.reader's code as from the file."""

    def __init__(self, name: str, start: int, data: memoryview | bytes) -> None:
        super().__init__(name, memoryview(data))
        self.start = start

    def seek(self, offset: int, whence: int = io.SEEK_SET) -> int:
        return super().seek(offset - self.start if whence == io.SEEK_SET else offset, whence) + self.start

    def tell(self) -> int:
        return self.pos + self.start


@dataclass
class Landing:
    """One item of this rank's plan whose file another rank read: the file's bytes [start, start + nbytes) it asks
    for (nbytes 0: none travel) and `into`, the uint8 tensor they land in (None until its bytes come: a record's
    buffer is made by checkpoint.exchange_rounds in the round its first bytes arrive)."""

    item: ReadItem
    info: _StorageInfo
    target: torch.Tensor
    start: int
    nbytes: int
    into: torch.Tensor | None
    small: bytes | None = None
    """A small record's bytes, which came with its description."""
    in_place: bool = False
    """Whether `into` is the destination's own memory (the item is loaded once its bytes are there)."""

    def held(self, name: str) -> HeldRange:
        """The record as a file to read the item from, once its bytes arrived (not in place)."""
        data = self.small if self.small is not None else self.into.cpu().numpy()
        return HeldRange(name, self.info.offset, memoryview(data))


def land(item: ReadItem, info: _StorageInfo, saved: SavedTensor | None, target: torch.Tensor, *, device: torch.device):
    """Where `item` of the record `info` (described as `saved`, None where it could not be) lands on this rank,
    whose destination is `target`: in it where the record's tensor is the whole of it and the bytes travel on the
    CPU (gloo), else the whole record in a buffer on `device`, where the exchange runs, made when its bytes come."""
    if saved is not None and saved.record is not None:
        return Landing(item, info, target, info.offset, 0, None, small=saved.record)
    whole = saved is not None and tuple(item.lengths) == saved.shape and not any(item.storage_offsets)
    if whole and device.type == "cpu" and saved.fills(target):
        into = target.reshape(-1).view(torch.uint8)
        return Landing(item, info, target, info.offset + saved.data_offset, saved.data_bytes, into, in_place=True)
    return Landing(item, info, target, info.offset, info.length, None)
