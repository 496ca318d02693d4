"""Memory a checkpoint reader shares with the ranks of its host (checkpoint.host_shared): another process maps it
while the reader holds it and reads its bytes; a forged or stale address, a reader that has let go of it or has gone,
maps nothing, so the bytes go over the group instead."""

from __future__ import annotations

import dataclasses
import hashlib
import json
import subprocess
import sys

import pytest
import torch

from trainflow.checkpoint.host_shared import Address, SharedBytes, mapped

pytestmark = pytest.mark.skipif(sys.platform != "linux", reason="memfd and /proc are Linux's")

PEER = """
import hashlib, json, sys
from trainflow.checkpoint.host_shared import Address, mapped
for address in json.loads(sys.argv[1]):
    data = mapped(Address(**address))
    print("none" if data is None else hashlib.sha256(data.numpy()).hexdigest())
"""


def peer_maps(*addresses: Address) -> list[str]:
    """What another process of this host maps at each of `addresses`: the SHA-256 of its bytes, or 'none'."""
    said = json.dumps([dataclasses.asdict(a) for a in addresses])
    return subprocess.run([sys.executable, "-c", PEER, said], capture_output=True, text=True, check=True).stdout.split()


def test_a_peer_maps_the_readers_bytes_and_nothing_at_a_forged_or_stale_address():
    shared = SharedBytes(3 << 20)
    shared.tensor.copy_(torch.randint(0, 256, (3 << 20,), dtype=torch.uint8))
    forged = [
        dataclasses.replace(shared.address, token="0" * 32),  # the descriptor, another memfd's name
        dataclasses.replace(shared.address, bytes=1 << 20),
        dataclasses.replace(shared.address, fd=0),  # another file of the reader's
    ]
    sha = hashlib.sha256(shared.tensor.numpy()).hexdigest()
    assert peer_maps(shared.address, *forged) == [sha, "none", "none", "none"]
    shared.unshare()
    assert peer_maps(shared.address) == ["none"]  # the reader let go: peers that mapped it keep their mapping
    assert shared.tensor.sum() > 0  # the reader's own view stays


def test_a_reader_that_has_gone_shares_nothing():
    gone = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    address = Address(int(gone.stdout), 3, "0" * 32, 1 << 20)
    assert mapped(address) is None and mapped(None) is None
