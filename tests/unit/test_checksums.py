"""CRC-32C manifests against a second implementation; corruption is named by file; a manifest is
complete both ways or the checkpoint is invalid."""

from __future__ import annotations

import json
import os

import pytest

from trainflow.checkpoint.manifest import MANIFEST, ChecksumError, Provenance, verify, write_manifest
from trainflow.crc import file_crc


def crc32c_reference(data: bytes) -> int:
    """Bitwise CRC-32C (Castagnoli, reflected polynomial 0x82F63B78): the slow textbook definition."""
    crc = 0xFFFFFFFF
    for byte in data:
        crc ^= byte
        for _ in range(8):
            crc = (crc >> 1) ^ (0x82F63B78 & -(crc & 1))
    return crc ^ 0xFFFFFFFF


def test_check_value_of_the_standard():
    assert crc32c_reference(b"123456789") == 0xE3069283  # the CRC-32C check value (RFC 3720)


@pytest.mark.parametrize("size", [0, 1, 4095, 70_001])
def test_file_crc_matches_the_reference(tmp_path, size):
    data = os.urandom(size)
    path = tmp_path / "blob"
    path.write_bytes(data)
    assert file_crc(path) == (size, crc32c_reference(data))


def dcp_folder(folder, *, ranks: int = 3, files_per_rank: int = 2, **manifest: object) -> None:
    """A checkpoint folder laid out as DCP writes one (random bytes for contents), with its manifest."""
    for rank in range(ranks):
        for i in range(files_per_rank):
            (folder / f"__{rank}_{i}.distcp").write_bytes(os.urandom(5000))
    (folder / ".metadata").write_bytes(os.urandom(100))
    write_manifest(folder, **manifest)


def edit_manifest(folder, edit) -> None:
    path = folder / MANIFEST
    manifest = json.loads(path.read_text())
    edit(manifest)
    path.write_text(json.dumps(manifest))


def unlist(folder, name: str) -> None:
    """Drop a file from the manifest and its count, as someone hiding a shard would."""

    def drop(manifest):
        del manifest["files"][name]
        manifest["file_count"] = len(manifest["files"])

    edit_manifest(folder, drop)


def test_manifest_detects_a_flipped_byte_and_names_the_file(tmp_path):
    dcp_folder(tmp_path, files_per_rank=1, world_size=3, step=3)
    assert json.loads((tmp_path / MANIFEST).read_text())["file_count"] == 4
    manifest = verify(tmp_path)
    assert (len(manifest.files), manifest.nbytes, manifest.world_size) == (4, 15100, 3)
    victim = tmp_path / "__1_0.distcp"
    data = bytearray(victim.read_bytes())
    data[1234] ^= 0x01
    victim.write_bytes(bytes(data))
    with pytest.raises(ChecksumError, match=r"__1_0\.distcp.*corrupt"):
        verify(tmp_path)


def test_missing_manifest_or_file_is_reported(tmp_path):
    with pytest.raises(ChecksumError, match="never completed"):
        verify(tmp_path)
    dcp_folder(tmp_path)
    (tmp_path / "__2_1.distcp").unlink()
    with pytest.raises(ChecksumError, match=r"__2_1\.distcp is listed in manifest\.json but missing"):
        verify(tmp_path)


def test_world_size_defaults_to_the_ranks_the_file_names_count(tmp_path):
    dcp_folder(tmp_path, ranks=2)
    assert verify(tmp_path).world_size == 2


def test_an_omitted_shard_is_caught_even_when_corrupt_and_dropped_from_the_count(tmp_path):
    dcp_folder(tmp_path, world_size=3)
    (tmp_path / "__1_1.distcp").write_bytes(b"corrupt")
    unlist(tmp_path, "__1_1.distcp")
    with pytest.raises(ChecksumError, match=r"holds '__1_1\.distcp', which manifest\.json does not list"):
        verify(tmp_path)


def test_an_unlisted_extra_file_is_caught(tmp_path):
    dcp_folder(tmp_path, world_size=3)
    (tmp_path / "sub").mkdir()
    (tmp_path / "sub" / "payload.pt").write_bytes(b"anything")
    with pytest.raises(ChecksumError, match=r"holds 'sub/payload\.pt', which manifest\.json does not list"):
        verify(tmp_path)


def test_a_wrong_file_count_is_caught(tmp_path):
    dcp_folder(tmp_path, world_size=3)
    edit_manifest(tmp_path, lambda m: m.update(file_count=6))
    with pytest.raises(ChecksumError, match=r"lists 7 files but records file_count 6"):
        verify(tmp_path)


def test_a_rank_without_its_files_is_caught(tmp_path):
    """A 4-rank checkpoint whose rank 3 files were removed, manifest entries and count included."""
    dcp_folder(tmp_path, world_size=4)
    with pytest.raises(ChecksumError, match=r"lists no __3_0\.distcp, which rank 3 of world_size 4 writes"):
        verify(tmp_path)
    dcp_folder(tmp_path, world_size=3)
    (tmp_path / "__1_0.distcp").unlink()
    unlist(tmp_path, "__1_0.distcp")
    with pytest.raises(ChecksumError, match=r"lists no __1_0\.distcp, which rank 1 of world_size 3 writes"):
        verify(tmp_path)


@pytest.mark.parametrize("name", ["../outside", "__3_0.distcp", "model.pt"])
def test_a_listed_name_dcp_does_not_write_is_caught_before_anything_is_read(tmp_path, name):
    dcp_folder(tmp_path, world_size=3)
    edit_manifest(tmp_path, lambda m: m.update(file_count=8, files={**m["files"], name: {"bytes": 1, "crc32c": 0}}))
    with pytest.raises(ChecksumError, match=rf"lists '{name}', which DCP does not write at world_size 3"):
        verify(tmp_path)


HOSTILE = {
    "no world_size": (lambda m: m.pop("world_size"), r"manifest\.json lacks Manifest's field 'world_size'"),
    "world_size 0": (lambda m: m.update(world_size=0), r"records algorithm 'crc32c' and world_size 0, where"),
    "another algorithm": (lambda m: m.update(algorithm="md5"), r"records algorithm 'md5'"),
    "a text count": (lambda m: m.update(file_count="7"), r"manifest\.json\.file_count holds '7', not a int"),
    "a bool size": (lambda m: m["files"][".metadata"].update(bytes=True), r"\.metadata\.bytes holds True, not a int"),
    "an unknown field": (lambda m: m.update(run="os.system('x')"), r"holds 'run', which Manifest has no field for"),
    "a number as init_from": (lambda m: m.update(init_from=5), r"manifest\.json\.init_from holds 5, not a str"),
}


@pytest.mark.parametrize("case", HOSTILE, ids=list(HOSTILE))
def test_a_manifest_that_is_not_what_trainflow_writes_is_one_line(tmp_path, case):
    edit, match = HOSTILE[case]
    dcp_folder(tmp_path, step=3)
    edit_manifest(tmp_path, edit)
    with pytest.raises(ChecksumError, match=match) as err:
        verify(tmp_path)
    assert "\n" not in str(err.value) and str(err.value).endswith("trainflow falls back to the previous one)")


def test_a_manifest_round_trips_and_leaves_out_what_it_does_not_record(tmp_path):
    dcp_folder(tmp_path, step=3, provenance=Provenance(layout="tp2", init_from="hf/tiny"))
    written = json.loads((tmp_path / MANIFEST).read_text())
    assert sorted(written) == [
        "algorithm",
        "file_count",
        "files",
        "format",
        "init_from",
        "layout",
        "step",
        "world_size",
    ]
    manifest = verify(tmp_path)
    assert (manifest.step, manifest.layout, manifest.init_from, manifest.guard) == (3, "tp2", "hf/tiny", None)
    assert manifest.world_size == 3 and len(manifest.files) == 7 and manifest.nbytes == 6 * 5000 + 100


def test_a_listed_file_replaced_by_a_symbolic_link_is_caught(tmp_path):
    folder = tmp_path / "step-00000001"
    folder.mkdir()
    (folder / ".metadata").write_bytes(b"m")
    (folder / "__0_0.distcp").write_bytes(b"x" * 10)
    write_manifest(folder, world_size=1)
    outside = tmp_path / "outside"
    outside.write_bytes(b"x" * 10)
    (folder / "__0_0.distcp").unlink()
    (folder / "__0_0.distcp").symlink_to(outside)
    with pytest.raises(ChecksumError, match="__0_0.distcp is listed in manifest.json but missing or no regular file"):
        verify(folder)


@pytest.mark.parametrize("text", ["[" * 100_000, b"\xff\xfe{".decode("latin-1")], ids=["deeply-nested", "not-utf8"])
def test_a_manifest_that_is_not_json_is_one_line(tmp_path, text):
    dcp_folder(tmp_path)
    (tmp_path / "manifest.json").write_text(text, encoding="latin-1")
    with pytest.raises(ChecksumError, match=r"manifest.json is not readable JSON .*the checkpoint is damaged"):
        verify(tmp_path)
