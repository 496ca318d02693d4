"""One tensor record of a DCP shard file, described without torch.load: where its bytes lie and what tensor they
make, so checkpoint.reader can read them straight into their destination.

    python -c "import io, torch; from trainflow.checkpoint.tensor_record import describe; b = io.BytesIO(); \
        torch.save(torch.ones(3), b); print(describe(b, 0, len(b.getvalue())))"

A record is what torch.save writes for one tensor: a zip of `data.pkl` (the pickle that rebuilds the tensor from
its storage), the storage's bytes in `data/0` and a few small entries. torch.load(map_location="meta",
weights_only=True) tells the same, but costs ~0.4 ms a record on this VM (its weights-only unpickler is pure
Python, and its zip reader calls back into Python for every seek of a file view): with a quarter of a small model's
tensors being scalars, that was a third of a load. Here the zip directory is still torch's own reader
(torch._C.PyTorchFileReader), over the record's first and last HEAD bytes read once, and `data.pkl` goes through
TensorUnpickler: the C unpickler allowed to name one rebuild function, the legacy storage types and OrderedDict,
and building nothing: it returns the description. A record it does not know (another torch's format, a storage
that is not one legacy type) is described as None, and the reader falls back to DCP's own path, torch.load with
weights_only=True.
"""

from __future__ import annotations

import io
import os
import pickle
from collections import OrderedDict
from dataclasses import dataclass

import torch
from torch.storage import _storage_type_to_dtype_map

from trainflow.torch_compat import record_size

HEAD = 4096
"""Bytes read at each end of a record: the zip directory at its end, data.pkl and data/0's header at its start."""


@dataclass(frozen=True)
class SavedTensor:
    """What a record holds: a tensor of `dtype`, `shape` and `stride` at `storage_offset` elements into a storage
    of `numel` elements, whose bytes start `data_offset` bytes into the record and run `data_bytes`."""

    dtype: torch.dtype
    shape: tuple[int, ...]
    stride: tuple[int, ...]
    storage_offset: int
    numel: int
    data_offset: int
    data_bytes: int
    record: bytes | None = None
    """The whole record where it is small (at most 2 x HEAD bytes) and was read in one go: its data is in here."""

    def fills(self, target: torch.Tensor) -> bool:
        """Whether its bytes are exactly those of the contiguous CPU tensor `target`, in order."""
        return (
            self.dtype == target.dtype
            and self.shape == tuple(target.shape)
            and _contiguous(self.shape, self.stride)
            and self.storage_offset == 0
            and self.numel == target.numel()
            and self.data_bytes == target.nbytes
            and target.is_contiguous()
            and target.device.type == "cpu"
        )


def _contiguous(shape: tuple[int, ...], stride: tuple[int, ...]) -> bool:
    """torch's is_contiguous of a dense tensor: row-major strides, any stride on a dimension of size 1."""
    expected = 1
    for size, step in zip(reversed(shape), reversed(stride)):
        if size != 1 and step != expected:
            return False
        expected *= size
    return True


@dataclass(frozen=True)
class _Storage:
    dtype: torch.dtype
    key: str
    numel: int


class _LegacyStorage(str):
    """Stands for torch.<Type>Storage in a pickle: only its name is used (for its dtype)."""


def _rebuild(storage: object, storage_offset: object, size: object, stride: object, *rest: object) -> tuple:
    """torch._utils._rebuild_tensor_v2's arguments, checked and returned instead of a tensor."""
    ints = (storage_offset, *(size if isinstance(size, tuple) else ()), *(stride if isinstance(stride, tuple) else ()))
    if not (isinstance(storage, _Storage) and isinstance(size, tuple) and isinstance(stride, tuple)):
        raise pickle.UnpicklingError("not one tensor of one storage")
    if len(size) != len(stride) or not all(type(i) is int for i in ints):
        raise pickle.UnpicklingError("sizes, strides and offset are not integers")
    return storage, storage_offset, size, stride


class TensorUnpickler(pickle.Unpickler):
    """Unpickles torch.save's data.pkl of one tensor into (storage, offset, size, stride); refuses any other name."""

    def find_class(self, module: str, name: str) -> object:
        if (module, name) == ("torch._utils", "_rebuild_tensor_v2"):
            return _rebuild
        if (module, name) == ("collections", "OrderedDict"):
            return OrderedDict
        if module == "torch" and name in _storage_type_to_dtype_map():
            return _LegacyStorage(name)
        raise pickle.UnpicklingError(f"it names {module}.{name}")

    def persistent_load(self, pid: object) -> _Storage:
        if not (
            isinstance(pid, tuple) and len(pid) == 5 and pid[0] == "storage" and isinstance(pid[1], _LegacyStorage)
        ):
            raise pickle.UnpicklingError("a persistent id that is no storage")
        _, kind, key, location, numel = pid
        if not (isinstance(key, str) and location == "cpu" and type(numel) is int):
            raise pickle.UnpicklingError("a storage that is not on the CPU")
        return _Storage(_storage_type_to_dtype_map()[kind], key, numel)


class _RecordView(io.RawIOBase):
    """The bytes of one record longer than 2 x HEAD, [offset, offset + length) of `f`, as a stream; its first and
    last HEAD bytes are read once, anything else (never asked for by the zip directory's reader) from the file."""

    def __init__(self, f: io.BufferedIOBase, offset: int, length: int) -> None:
        super().__init__()
        self.f, self.offset, self.length, self.pos = f, offset, length, 0
        f.seek(offset)
        self.head, self.tail_at = f.read(HEAD), length - HEAD
        f.seek(offset + self.tail_at)
        self.tail = f.read(HEAD)

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def tell(self) -> int:
        return self.pos

    def seek(self, pos: int, whence: int = os.SEEK_SET) -> int:
        self.pos = {os.SEEK_SET: pos, os.SEEK_CUR: self.pos + pos, os.SEEK_END: self.length + pos}[whence]
        return self.pos

    def readinto(self, buf) -> int:
        n = max(0, min(len(buf), self.length - self.pos))
        end = self.pos + n
        if end <= len(self.head):
            data = self.head[self.pos : end]
        elif self.pos >= self.tail_at:
            data = self.tail[self.pos - self.tail_at : end - self.tail_at]
        else:
            self.f.seek(self.offset + self.pos)
            data = self.f.read(n)
        buf[: len(data)] = data
        self.pos += len(data)
        return len(data)


def describe(f: io.BufferedIOBase, offset: int, length: int) -> SavedTensor | None:
    """The tensor in the record at [offset, offset + length) of `f`, or None where it is not one legacy storage's
    tensor in the format this torch writes. Raises what torch's zip reader raises on a damaged record."""
    record = None
    if length <= 2 * HEAD:  # one read, and torch's zip reader on bytes in C rather than a view's Python methods
        f.seek(offset)
        record = f.read(length)
        zipped = torch._C.PyTorchFileReader(io.BytesIO(record))
    else:
        zipped = torch._C.PyTorchFileReader(_RecordView(f, offset, length))
    try:
        storage, storage_offset, size, stride = TensorUnpickler(io.BytesIO(zipped.get_record("data.pkl"))).load()
    except (pickle.UnpicklingError, EOFError, ValueError, TypeError, KeyError, IndexError):
        return None
    name = f"data/{storage.key}"
    if not zipped.has_record(name):
        return None
    data_offset = zipped.get_record_offset(name)
    data_bytes = record_size(zipped, name, numel=storage.numel, itemsize=storage.dtype.itemsize)
    if data_offset + data_bytes > length:
        return None
    return SavedTensor(storage.dtype, size, stride, storage_offset, storage.numel, data_offset, data_bytes, record)
