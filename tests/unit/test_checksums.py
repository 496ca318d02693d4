"""CRC-32C manifests against a second implementation; corruption is named by file."""

from __future__ import annotations

import os

import pytest

from trainflow.checkpoint.manifest import ChecksumError, file_crc, verify, write_manifest


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


def test_manifest_detects_a_flipped_byte_and_names_the_file(tmp_path):
    for i in range(3):
        (tmp_path / f"__{i}_0.distcp").write_bytes(os.urandom(5000))
    manifest = write_manifest(tmp_path, step=3)
    assert len(manifest["files"]) == 3
    assert verify(tmp_path) == {"files": 3, "bytes": 15000}
    victim = tmp_path / "__1_0.distcp"
    data = bytearray(victim.read_bytes())
    data[1234] ^= 0x01
    victim.write_bytes(bytes(data))
    with pytest.raises(ChecksumError, match=r"__1_0\.distcp.*corrupt"):
        verify(tmp_path)


def test_missing_manifest_or_file_is_reported(tmp_path):
    with pytest.raises(ChecksumError, match="never completed"):
        verify(tmp_path)
    (tmp_path / "a").write_bytes(b"x")
    write_manifest(tmp_path)
    (tmp_path / "a").unlink()
    with pytest.raises(ChecksumError, match="listed in manifest.json but missing"):
        verify(tmp_path)
