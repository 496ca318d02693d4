"""CheckpointManager on a 1-rank group: write-time checksums equal a re-read, in-place loads equal
DCP's own, foreign pickles are refused, pruning keeps what it must."""

from __future__ import annotations

import ast
import os
import pickle

import pytest
import torch
import torch.distributed.checkpoint as dcp
from torch.utils.serialization import config as serialization_config

from tests.conftest import REPO
from tests.support import blank_like, flat, sample_state
from trainflow.checkpoint.manager import CheckpointManager, list_steps, step_dir
from trainflow.checkpoint.manifest import ChecksumError, verify, write_manifest
from trainflow.checkpoint.reader import InPlaceReader
from trainflow.checkpoint.reading import ShortReadError, read_into
from trainflow.checkpoint.single_read import SingleReader

pytestmark = pytest.mark.usefixtures("one_rank_group")


def test_save_checksums_match_a_reread_and_load_reads_in_place(tmp_path, monkeypatch):
    manager = CheckpointManager(tmp_path, keep=2, pinned=set())
    state = sample_state()
    manager.save(5, state)
    manager.close()
    assert serialization_config.save.compute_crc32  # switched off only inside save
    assert len(verify(step_dir(tmp_path, 5)).files) == 3  # two shard files + .metadata, re-read and CRC'd

    fell_back = []
    dcp_read = SingleReader.read_copied

    def spy(self, f, item, planner):
        fell_back.append(item.dest_index.fqn)
        return dcp_read(self, f, item, planner)

    monkeypatch.setattr(SingleReader, "read_copied", spy)
    loaded = blank_like(state)
    loaded["model"]["w_t"] = torch.zeros(16, 48).t()
    manager.load(5, loaded)
    for key, want in flat(state).items():
        got = flat(loaded)[key]
        assert got.dtype == want.dtype and torch.equal(got, want), key
    assert fell_back == ["model.w_t"]  # the transposed tensor goes through DCP's torch.load; the rest in place


def test_in_place_reader_converts_like_dcp_when_dtypes_differ(tmp_path):
    state = sample_state()
    dcp.save(state, checkpoint_id=tmp_path)
    target = blank_like(state)
    target["model"]["w"] = torch.zeros(64, 32, dtype=torch.float64)
    dcp.load(target, storage_reader=InPlaceReader(tmp_path))
    assert torch.equal(target["model"]["w"], state["model"]["w"].double())


def test_metadata_naming_anything_else_is_refused_in_one_line(tmp_path):
    manager = CheckpointManager(tmp_path, keep=1, pinned=set())
    state = sample_state()
    manager.save(3, state)
    manager.close()
    (step_dir(tmp_path, 3) / ".metadata").write_bytes(pickle.dumps(os.getcwd))
    write_manifest(step_dir(tmp_path, 3))  # forged to match, as an attacker would: else its CRC refuses it first
    with pytest.raises(
        ChecksumError,
        match=r"failed on rank 0: .*\.metadata is not a trainflow checkpoint file "
        r"\(UnpicklingError: it names 'posix\.getcwd', which no trainflow checkpoint holds",
    ) as err:
        manager.load(3, blank_like(state))
    assert "\n" not in str(err.value)
    assert f"verify_checkpoint io.checkpoints={tmp_path}" in str(err.value) and "lfs getstripe" in str(err.value)


def test_manifest_refuses_a_file_whose_size_is_not_what_was_checksummed(tmp_path):
    (tmp_path / "__0_0.distcp").write_bytes(b"x" * 12)
    with pytest.raises(ChecksumError, match=r"holds 12 bytes but 10 were written"):
        write_manifest(tmp_path, {"__0_0.distcp": (10, 0)})


def test_prune_keeps_the_newest_and_the_pinned_and_clears_leftovers(tmp_path):
    manager = CheckpointManager(tmp_path, keep=1, pinned={2})
    state = sample_state()
    (tmp_path / "step-00000009.tmp").mkdir(parents=True)  # a crashed save
    (tmp_path / "step-00000001.pruned").mkdir()  # a crashed prune
    for step in (1, 2, 3, 4):
        manager.save(step, state)
    manager.close()
    assert list_steps(tmp_path) == [2, 4]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["step-00000002", "step-00000004"]


def test_a_rollback_discards_every_checkpoint_newer_than_its_step(tmp_path):
    # Saved at steps 2, 4 and 6, the loss went bad at step 3: a rollback to 2 removes 4 and 6, which a resume would
    # otherwise pick as the newest and train on from inside the bad run.
    manager = CheckpointManager(tmp_path, keep=5, pinned={6})
    state = sample_state()
    for step in (2, 4, 6):
        manager.save(step, state)
    done, removed = manager.discard_after(2)
    manager.close()
    assert removed == [4, 6] and list_steps(tmp_path) == [2] and done == []
    assert sorted(p.name for p in tmp_path.iterdir()) == ["step-00000002"]


def test_the_checkpoint_package_has_no_import_circle():
    """Every import between checkpoint's modules, TYPE_CHECKING ones included, points one way: the save paths call
    the committer, never back into the manager."""
    package = REPO / "src/trainflow/checkpoint"
    imports = {
        path.stem: {
            node.module.split(".")[2]
            for node in ast.walk(ast.parse(path.read_text()))
            if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("trainflow.checkpoint.")
        }
        for path in package.glob("*.py")
    }
    done: set[str] = set()

    def visit(module: str, path: tuple[str, ...]) -> None:
        assert module not in path, f"import circle: {' -> '.join((*path, module))}"
        if module not in done:
            for imported in imports.get(module, ()):
                visit(imported, (*path, module))
            done.add(module)

    for module in imports:
        visit(module, ())
    assert {"commit", "saves"} <= imports["async_saves"] and "manager" not in imports["async_saves"]


def test_read_into_fills_a_tensor_and_names_a_file_that_ends_early(tmp_path):
    data = torch.arange(6, dtype=torch.float32)
    path = tmp_path / "blob"
    path.write_bytes(b"\0" * 8 + data.numpy().tobytes())
    into = torch.empty(2, 3)
    with open(path, "rb") as f:
        f.seek(8)
        read_into(f, into, name="'model.w'")
    assert torch.equal(into.reshape(-1), data)
    with open(path, "rb") as f, pytest.raises(ShortReadError) as err:
        f.seek(16)
        read_into(f, into, name="'model.w'")
    assert str(err.value) == (
        f"{path} ends inside 'model.w' (16 of 24 bytes read): it was truncated or changed while it was read"
    )
