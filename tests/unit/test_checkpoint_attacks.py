"""What someone with write access to a checkpoint folder can do: make a checkpoint invalid (one-line
error, or a fall-back to the previous one), never make a load run code. Each forgery below also
rewrites manifest.json to match every byte, as a deliberate attacker would. Plus full disks: a
failed save says so in one line and leaves no checkpoint behind."""

from __future__ import annotations

import errno
import json
import os
import pickle
import threading

import pytest
import torch
from torch.distributed.checkpoint.filesystem import _StorageInfo
from torch.distributed.checkpoint.metadata import BytesStorageMetadata, MetadataIndex

from tests.support import blank_like, sample_state
from trainflow.checkpoint.manager import CheckpointManager, CheckpointWriteError, list_steps, step_dir
from trainflow.checkpoint.manifest import MANIFEST, ChecksumError
from trainflow.checkpoint.verify import VerifyError, verify_all
from trainflow.checkpoint.writer import ChecksummedFile
from trainflow.crc import file_crc

pytestmark = pytest.mark.usefixtures("one_rank_group")


class CreatesFile:
    """Unpickling this creates `path`: the stand-in for any code a pickle can run."""

    def __init__(self, path: str) -> None:
        self.path = path

    def __reduce__(self):
        return open, (self.path, "w")


def forge_manifest(folder, **changes: object) -> None:
    """Rewrite manifest.json to match the folder's bytes now, as an attacker would."""
    path = folder / MANIFEST
    manifest = json.loads(path.read_text())
    files = sorted(p for p in folder.iterdir() if p.is_file() and p.name != MANIFEST)
    manifest["files"] = {p.name: dict(zip(("bytes", "crc32c"), file_crc(p), strict=True)) for p in files}
    manifest.update(file_count=len(files), **changes)
    path.write_text(json.dumps(manifest))


def saved(tmp_path, *steps: int) -> tuple[CheckpointManager, dict]:
    manager = CheckpointManager(tmp_path, keep=len(steps), pinned=set())
    state = sample_state()
    for step in steps:
        manager.save(step, state)
    manager.wait()
    return manager, state


def test_bytes_metadata_pointing_at_a_pickle_runs_nothing(tmp_path):
    """DCP reads a BytesStorageMetadata entry with torch.load(weights_only=False): the code-execution hole."""
    manager, state = saved(tmp_path / "ckpt", 3)
    folder, marker = step_dir(manager.root, 3), tmp_path / "pwned"
    payload = pickle.dumps(CreatesFile(str(marker)))
    (folder / "__0_2.distcp").write_bytes(payload)  # named like a shard, so the file list looks whole
    metadata = pickle.loads((folder / ".metadata").read_bytes())  # our own file, unpickled by the test
    metadata.state_dict_metadata["step"] = BytesStorageMetadata()
    metadata.storage_data = {k: v for k, v in metadata.storage_data.items() if k.fqn != "step"}
    metadata.storage_data[MetadataIndex("step")] = _StorageInfo("__0_2.distcp", 0, len(payload))
    (folder / ".metadata").write_bytes(pickle.dumps(metadata))
    forge_manifest(folder)

    assert manager.newest_complete(at_most=10) == 3  # every byte matches the forged manifest
    with pytest.raises(ChecksumError) as err:
        manager.load(3, blank_like(state))
    assert not marker.exists()
    assert "BytesStorageMetadata" in str(err.value) and "\n" not in str(err.value)
    manager.close()


def test_metadata_with_keys_the_state_lacks_is_refused(tmp_path):
    manager, state = saved(tmp_path, 3)
    folder = step_dir(tmp_path, 3)
    metadata = pickle.loads((folder / ".metadata").read_bytes())
    metadata.state_dict_metadata["extra"] = metadata.state_dict_metadata["step"]
    (folder / ".metadata").write_bytes(pickle.dumps(metadata))
    forge_manifest(folder)
    with pytest.raises(ChecksumError, match=r"\.metadata holds keys the state being loaded lacks: 'extra';") as err:
        manager.load(3, blank_like(state))
    assert "\n" not in str(err.value)
    manager.close()


@pytest.mark.parametrize("content", ["pickle", "noise", "text"])
def test_a_shard_replaced_by_a_foreign_file_is_named_in_one_line(tmp_path, content):
    manager, state = saved(tmp_path / "ckpt", 3)
    folder, marker = step_dir(manager.root, 3), tmp_path / "pwned"
    victim = folder / "__0_1.distcp"
    victim.write_bytes(
        {
            "pickle": pickle.dumps(CreatesFile(str(marker))),
            "noise": os.urandom(victim.stat().st_size),
            "text": b"not a tensor\n" * 100,
        }[content]
    )
    forge_manifest(folder)
    with pytest.raises(ChecksumError, match=rf"{victim} is not a trainflow checkpoint file") as err:
        manager.load(3, blank_like(state))
    assert not marker.exists() and "\n" not in str(err.value)
    manager.close()


def test_an_unlisted_file_makes_the_loader_fall_back_and_the_stage_report_it(tmp_path):
    manager, state = saved(tmp_path, 2, 3)
    (step_dir(tmp_path, 3) / "__0_9.distcp").write_bytes(b"planted")
    assert manager.newest_complete(at_most=10) == 2
    manager.close()
    with pytest.raises(VerifyError, match=r"holds '__0_9\.distcp', which manifest\.json does not list"):
        verify_all(tmp_path)


def test_a_full_disk_fails_the_save_in_one_line_and_leaves_no_checkpoint(tiny_tmpfs):
    manager, _ = saved(tiny_tmpfs, 1)
    big = {"model": {"w": torch.randn(256, 512)}, "step": torch.tensor(2)}  # 512 kB, twice the file system
    with pytest.raises(CheckpointWriteError) as err:
        manager.save(2, big)
    manager.close()
    assert str(err.value).startswith(f"no space left on {tiny_tmpfs} writing step 2 ({tiny_tmpfs}/step-00000002.tmp/")
    assert "rank 0; needs ~0.000524 GB" in str(err.value)
    assert "\n" not in str(err.value)
    assert list_steps(tiny_tmpfs) == [1] and not (tiny_tmpfs / "step-00000002.tmp").exists()
    assert manager.newest_complete(at_most=10) == 1


def test_a_write_error_in_a_dcp_writer_thread_fails_the_save(tmp_path, monkeypatch):
    """DCP drops the exception of a writer thread other than its calling one; the save must not."""
    write = ChecksummedFile.write

    def fails_off_the_main_thread(self, data):
        if threading.current_thread() is not threading.main_thread():
            raise OSError(errno.EIO, os.strerror(errno.EIO))
        return write(self, data)

    monkeypatch.setattr(ChecksummedFile, "write", fails_off_the_main_thread)
    manager = CheckpointManager(tmp_path, keep=1, pinned=set(), io_threads=2)
    with pytest.raises(CheckpointWriteError, match=rf"^Input/output error on {tmp_path} writing step 4 \(.*\.distcp"):
        manager.save(4, sample_state())
    manager.close()
    assert list_steps(tmp_path) == []
