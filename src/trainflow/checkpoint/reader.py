"""DCP's file-system reader, reading tensors in place and unpickling only what trainflow's own state produces.

The files are DCP's own format: dcp.FileSystemReader reads them too. What differs is how (see
InPlaceReader) and what a load trusts: nothing in the folder, which anyone with write access to it
may have forged along with its manifest. `.metadata` is unpickled through an allow-list
(MetadataUnpickler) and must describe tensors only, in DCP's shard files (check_metadata); its keys
must be the keys of the state being loaded (ExactLoadPlanner); tensors go through
torch.load(weights_only=True). DCP's one path to torch.load(weights_only=False) is a bytes entry
(BytesStorageMetadata, read by DefaultLoadPlanner.load_bytes): trainflow's state is all tensors, so
each of those steps refuses bytes, and InPlaceReader.read_data refuses byte reads outright.
"""

from __future__ import annotations

import dataclasses
import io
import os
import pickle
from pathlib import Path

import torch
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.default_planner import DefaultLoadPlanner
from torch.distributed.checkpoint.filesystem import _StorageInfo
from torch.distributed.checkpoint.metadata import Metadata, MetadataIndex, StorageMeta, TensorStorageMetadata
from torch.distributed.checkpoint.planner import LoadItemType, LoadPlan, LoadPlanner, ReadItem
from torch.futures import Future

from trainflow.checkpoint.manifest import RANK_FILE, ChecksumError
from trainflow.checkpoint.reading import InPlaceReading, ShortReadError, read_into
from trainflow.checkpoint.tensor_record import describe


class MetadataUnpickler(pickle.Unpickler):
    """Unpickles the `.metadata` of trainflow's state and nothing else: DCP's dataclasses for tensors, torch
    dtypes and sizes, the checkpoint's path. DCP's reader uses plain pickle.load, which would run whatever
    a planted file names."""

    ALLOWED = {
        "torch.distributed.checkpoint.metadata": {
            "Metadata",
            "MetadataIndex",
            "StorageMeta",
            "ChunkStorageMetadata",
            "TensorStorageMetadata",
            "TensorProperties",
            "_MEM_FORMAT_ENCODING",
        },
        "torch.distributed.checkpoint.filesystem": {"_StorageInfo"},
        "torch.serialization": {"_get_layout"},
        "torch": {"Size"},
        "pathlib": {"PosixPath"},
    }

    def find_class(self, module: str, name: str) -> object:
        dtype = module == "torch" and isinstance(getattr(torch, name, None), torch.dtype)
        if dtype or name in self.ALLOWED.get(module, ()):
            return super().find_class(module, name)
        raise pickle.UnpicklingError(f"it names {f'{module}.{name}'!r}, which no trainflow checkpoint holds: refused")


def not_trainflows(path: str | os.PathLike, why: str) -> ChecksumError:
    return ChecksumError(
        f"{path} is not a trainflow checkpoint file ({why}); delete {Path(path).parent}, trainflow then falls back "
        "to the previous checkpoint"
    )


def check_metadata(metadata: object, path: str | os.PathLike) -> None:
    """What trainflow's `.metadata` holds: a DCP Metadata of tensors only, each stored plainly (no stream
    transforms, which trainflow never writes) in one of DCP's shard files of this folder."""
    if not (
        isinstance(metadata, Metadata)
        and isinstance(metadata.state_dict_metadata, dict)
        and isinstance(metadata.storage_data, dict)
        and isinstance(metadata.storage_meta, (StorageMeta, type(None)))
    ):
        raise not_trainflows(path, f"it holds a {type(metadata).__name__}, not DCP's Metadata of a state")
    for key, entry in metadata.state_dict_metadata.items():
        if not isinstance(entry, TensorStorageMetadata):
            raise not_trainflows(path, f"{key!r} is a {type(entry).__name__}; trainflow saves only tensors")
    for index, info in metadata.storage_data.items():
        name = getattr(index, "fqn", index)
        if not (
            isinstance(index, MetadataIndex)
            and isinstance(info, _StorageInfo)
            and isinstance(info.relative_path, str)
            and RANK_FILE.fullmatch(info.relative_path)
        ):
            raise not_trainflows(path, f"its entry for {name!r} is no tensor chunk in one of DCP's shard files")
        if info.transform_descriptors:
            raise not_trainflows(path, f"{name!r} is stored through transforms, which trainflow never writes")


def unpickled_metadata(f: io.RawIOBase | io.BufferedIOBase, path: str | os.PathLike) -> Metadata:
    """The `.metadata` in `f` (the file `path`), unpickled by MetadataUnpickler and checked by check_metadata."""
    try:
        metadata = MetadataUnpickler(f).load()
    except OSError:
        raise
    except Exception as err:
        raise not_trainflows(path, f"{type(err).__name__}: {' '.join(str(err).split())}") from err
    check_metadata(metadata, path)
    return metadata


class ExactLoadPlanner(DefaultLoadPlanner):
    """DCP's default load planner for a checkpoint whose keys are exactly those of the state being loaded.
    Keys the state has and the checkpoint lacks DCP refuses itself; keys only the checkpoint has, which
    DCP ignores, are refused here against the union of every rank's keys (under pipeline parallelism a
    rank holds only its own stages)."""

    def create_local_plan(self) -> LoadPlan:
        keys = sorted(self.state_dict)  # before DCP's plan, which may re-key the state for pre-2.4 checkpoints
        return dataclasses.replace(super().create_local_plan(), planner_data=keys)

    def create_global_plan(self, global_plan: list[LoadPlan]) -> list[LoadPlan]:
        wanted = set().union(*(plan.planner_data for plan in global_plan))
        if extra := sorted(set(self.metadata.state_dict_metadata) - wanted):
            raise ChecksumError(
                f".metadata holds keys the state being loaded lacks: {', '.join(map(repr, extra[:3]))}"
                f"{f' and {len(extra) - 3} more' if len(extra) > 3 else ''}; the checkpoint is of another model "
                "or was altered, load one saved from this model's state"
            )
        return super().create_global_plan([dataclasses.replace(plan, planner_data=None) for plan in global_plan])


class InPlaceReader(InPlaceReading, dcp.FileSystemReader):
    """dcp.FileSystemReader that reads a rank's files in parallel, reads each tensor straight into its
    destination (checkpoint.reading), and unpickles `.metadata` with MetadataUnpickler.

    DCP's reader torch.loads every tensor into fresh memory through a buffered view and copies it into
    place. Here each record is described first (checkpoint.tensor_record: dtype, shape, strides and the
    data's offset in the file, no data read, nothing built), and when the saved tensor is the whole
    contiguous destination, its bytes are read into the destination's memory with one readinto.
    Anything else (a reshard that reads part of a saved chunk, a non-contiguous destination, a record
    tensor_record does not know) goes through DCP's own path, torch.load(weights_only=True), file by
    file, so a failure names its file."""

    def __init__(self, path: str | os.PathLike, *, thread_count: int = 2) -> None:
        super().__init__(path)
        self.thread_count = thread_count
        self.metadata_error: Exception | None = None  # torch 2.11's dcp.load drops read_metadata's error

    def read_metadata(self) -> Metadata:
        """`.metadata`, unpickled by MetadataUnpickler and checked by check_metadata. Taking no `rank`
        keeps DCP from falling back to a rank's own `__{rank}.metadata`, which trainflow never writes."""
        try:
            metadata = self._checked_metadata()
        except Exception as err:
            self.metadata_error = err
            raise
        if metadata.storage_meta is None:
            metadata.storage_meta = StorageMeta()
        metadata.storage_meta.load_id = self.load_id
        return metadata

    def _checked_metadata(self) -> Metadata:
        path = self._get_metadata_path()
        with self.fs.create_stream(path, "rb") as f:
            return unpickled_metadata(f, path)

    def read_data(self, plan: LoadPlan, planner: LoadPlanner) -> Future[None]:
        for item in plan.items:
            if item.type == LoadItemType.BYTE_IO:  # DCP would torch.load it with weights_only=False
                raise ChecksumError(
                    f"{self._get_metadata_path()} asks to unpickle {item.storage_index.fqn!r} as bytes, which could "
                    f"run code: trainflow saves only tensors; delete {self.path}"
                )
        return super().read_data(plan, planner)

    def item_file(self, item: ReadItem) -> str:
        return str(self.fs.concat_path(self.path, self.storage_data[item.storage_index].relative_path))

    def item_offset(self, item: ReadItem) -> int:
        return self.storage_data[item.storage_index].offset

    def read_file(self, path: str, items: list[ReadItem], planner: LoadPlanner) -> None:
        """Read one file's items: in place where possible, the rest through DCP's path. Whatever the bytes
        turn out to hold, a failure other than the file system's is one line naming the file."""
        try:
            super().read_file(path, items, planner)
        except (OSError, ChecksumError, ShortReadError):
            raise
        except Exception as err:  # torch's text (weights_only advice, zip internals) would only mislead here
            raise not_trainflows(path, f"{type(err).__name__} reading it") from err

    def read_in_place(self, f: io.BufferedReader, item: ReadItem, planner: LoadPlanner) -> bool:
        info = self.storage_data[item.storage_index]
        saved = describe(f, info.offset, info.length)
        target = planner.resolve_tensor(item).detach()
        whole = saved is not None and tuple(item.lengths) == saved.shape and not any(item.storage_offsets)
        if not (whole and saved.fills(target)):
            return False
        if saved.record is not None:  # a small record, read whole already
            buf = memoryview(target.view(-1).view(torch.uint8).numpy())
            buf[:] = saved.record[saved.data_offset : saved.data_offset + len(buf)]
        else:
            f.seek(info.offset + saved.data_offset)
            read_into(f, target, name=repr(item.storage_index.fqn))
        planner.commit_tensor(item, target)
        return True
