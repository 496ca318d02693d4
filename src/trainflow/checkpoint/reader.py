"""DCP's file-system reader, reading tensors in place and unpickling only DCP's own metadata.

The files are DCP's own format: dcp.FileSystemReader reads them too. What differs is how: see
InPlaceReader.
"""

from __future__ import annotations

import dataclasses
import io
import os
import pickle
from concurrent.futures import ThreadPoolExecutor

import torch
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.metadata import Metadata, StorageMeta
from torch.distributed.checkpoint.planner import LoadItemType, LoadPlan, LoadPlanner, ReadItem
from torch.futures import Future


class MetadataUnpickler(pickle.Unpickler):
    """Unpickles DCP's `.metadata` and nothing else: its dataclasses, torch dtypes and sizes, paths.
    DCP's reader uses plain pickle.load, which would run whatever a planted file names."""

    ALLOWED = {
        "torch.distributed.checkpoint.metadata": {
            "Metadata", "MetadataIndex", "StorageMeta", "ChunkStorageMetadata", "TensorStorageMetadata",
            "BytesStorageMetadata", "TensorProperties", "_MEM_FORMAT_ENCODING",
        },
        "torch.distributed.checkpoint.filesystem": {"_StorageInfo"},
        "torch.serialization": {"_get_layout"},
        "torch": {"Size"},
        "pathlib": {"PosixPath", "PurePosixPath"},
    }

    def find_class(self, module: str, name: str) -> object:
        dtype = module == "torch" and isinstance(getattr(torch, name, None), torch.dtype)
        if dtype or name in self.ALLOWED.get(module, ()):
            return super().find_class(module, name)
        raise pickle.UnpicklingError(
            f"checkpoint metadata names {module}.{name}, which no DCP checkpoint holds; refusing to load it "
            "(the file was not written by trainflow: delete the checkpoint)"
        )


class InPlaceReader(dcp.FileSystemReader):
    """dcp.FileSystemReader that reads a rank's files in parallel, reads each tensor straight into its
    destination, and unpickles `.metadata` with MetadataUnpickler.

    DCP's reader torch.loads every tensor into fresh memory through a buffered view and copies it into
    place. Here each record is opened on the meta device (torch.load(map_location="meta"): dtype,
    shape, strides and the data's offset in the file, no data read), and when the saved tensor is the
    whole contiguous destination, its bytes are read into the destination's memory with one readinto.
    Anything else (a reshard that reads part of a saved chunk, a non-contiguous destination, a byte
    item) goes through DCP's own path."""

    def __init__(self, path: str | os.PathLike, *, thread_count: int = 2) -> None:
        super().__init__(path)
        self.thread_count = thread_count

    def read_metadata(self, *args: object, **kwargs: object) -> Metadata:
        with self.fs.create_stream(self._get_metadata_path(kwargs.get("rank")), "rb") as f:
            metadata = MetadataUnpickler(f).load()
        if getattr(metadata, "storage_meta", None) is None:
            metadata.storage_meta = StorageMeta()
        metadata.storage_meta.load_id = self.load_id
        return metadata

    def read_data(self, plan: LoadPlan, planner: LoadPlanner) -> Future[None]:
        per_file: dict[str, list[ReadItem]] = {}
        for item in plan.items:
            per_file.setdefault(self.storage_data[item.storage_index].relative_path, []).append(item)
        with ThreadPoolExecutor(max_workers=max(1, min(self.thread_count, len(per_file)))) as pool:
            left = pool.map(lambda kv: self._read_file(*kv, planner), per_file.items())
            rest = [item for items in left for item in items]
        if rest:
            super().read_data(dataclasses.replace(plan, items=rest), planner).wait()
        done: Future[None] = Future()
        done.set_result(None)
        return done

    def _read_file(self, relative_path: str, items: list[ReadItem], planner: LoadPlanner) -> list[ReadItem]:
        """Read what can be read in place from one file; the items left for DCP's path."""
        rest = []
        with open(self.fs.concat_path(self.path, relative_path), "rb") as f:
            # Items are read in file order, but each record's zip directory sits after its data,
            # which the kernel's readahead heuristic takes for random access without this hint.
            os.posix_fadvise(f.fileno(), 0, 0, os.POSIX_FADV_SEQUENTIAL)
            for item in sorted(items, key=lambda i: self.storage_data[i.storage_index].offset):
                if item.type == LoadItemType.BYTE_IO or not self._read_in_place(f, item, planner):
                    rest.append(item)
        return rest

    def _read_in_place(self, f: io.BufferedReader, item: ReadItem, planner: LoadPlanner) -> bool:
        info = self.storage_data[item.storage_index]
        if info.transform_descriptors:
            return False
        saved = torch.load(self._slice_file(f, info), map_location="meta", weights_only=True)
        offset = getattr(saved.untyped_storage(), "_checkpoint_offset", None)
        target = planner.resolve_tensor(item).detach()
        whole = tuple(item.lengths) == tuple(saved.shape) and not any(item.storage_offsets)
        if (offset is None or not whole or saved.dtype != target.dtype or saved.shape != target.shape
                or saved.storage_offset() != 0 or not saved.is_contiguous() or not target.is_contiguous()
                or target.device.type != "cpu"):
            return False
        buf = memoryview(target.view(-1).view(torch.uint8).numpy())
        f.seek(info.offset + offset)
        filled = 0
        while filled < len(buf):
            n = f.readinto(buf[filled:])
            if not n:
                raise EOFError(f"{f.name} ends inside {item.storage_index.fqn}: the checkpoint is truncated")
            filled += n
        planner.commit_tensor(item, target)
        return True
