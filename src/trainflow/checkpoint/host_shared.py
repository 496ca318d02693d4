"""A checkpoint file's bytes, read once by one rank into memory that the ranks on its host map and copy from:
checkpoint.single_read's exchange between peers that share a host.

    python -m pytest tests/unit/test_host_shared.py tests/unit/test_single_read.py

Gloo, the CPU backend, has no shared-memory transport: two ranks of one host exchange over TCP loopback, a copy into
the kernel and one out of it per byte plus the stack's work, on cores the load needs (benchmarks/checkpoint_load.py).
NCCL (its SHM and P2P transports) and MPI (vader, CMA) exchange within a node through memory; none of the libraries
we use offers that to gloo, so this module does it by hand, for CPU loads only (a device exchange is NCCL's).

The bytes live in a memfd (memfd_create): anonymous, with no name under /dev/shm and so nothing to leak, freed when
the last process holding it closes it or ends, a killed rank included. A peer opens it as /proc/<pid>/fd/<fd>, which
Linux allows a process of the same user in the same PID namespace, and checks that what it opened carries the
reader's random token and size; where it cannot (another host, another PID namespace, another user), `mapped` says
None and the bytes go over the group as before. The reader checked the bytes' CRC-32C before it offers them.
"""

from __future__ import annotations

import mmap
import os
import secrets
from dataclasses import dataclass

import torch

PREFIX = "trainflow-load-"


@dataclass(frozen=True)
class Address:
    """Where a peer on the same host finds a SharedBytes: the reader's process, its descriptor, the memfd's token,
    its size."""

    pid: int
    fd: int
    token: str
    bytes: int

    def link(self) -> str:
        """What /proc/<pid>/fd/<fd> reads as while the reader holds the memfd (Linux's name for a memfd)."""
        return f"/memfd:{PREFIX}{self.token} (deleted)"


class SharedBytes:
    """`size` bytes of memory (`tensor`, uint8), which processes of this user on this host can map while the reader
    holds it open; OSError where the memory cannot be had (reserved whole up front: no SIGBUS on a page later)."""

    def __init__(self, size: int) -> None:
        token = secrets.token_hex(16)
        self.fd: int | None = os.memfd_create(PREFIX + token, os.MFD_CLOEXEC)
        try:
            if size:
                os.posix_fallocate(self.fd, 0, size)
            self.map = mmap.mmap(self.fd, size) if size else None
        except OSError:
            os.close(self.fd)
            raise
        self.tensor = torch.frombuffer(self.map, dtype=torch.uint8) if size else torch.empty(0, dtype=torch.uint8)
        self.address = Address(os.getpid(), self.fd, token, size)

    def unshare(self) -> None:
        """Close the descriptor peers open it by (those that mapped it keep their mapping); `tensor` stays valid."""
        if self.fd is not None:
            os.close(self.fd)
            self.fd = None


def mapped(address: Address | None) -> torch.Tensor | None:
    """The bytes a reader on this host shares at `address`, mapped read-only into this process (copy on write, which
    nothing writes); None where they cannot be opened here."""
    if address is None or not address.bytes:
        return None
    try:
        fd = os.open(f"/proc/{address.pid}/fd/{address.fd}", os.O_RDONLY | os.O_CLOEXEC)
    except OSError:  # another host or PID namespace, another user, a reader that has gone
        return None
    try:  # the descriptor number may have been reused by the time this opens it: check what was opened
        if os.readlink(f"/proc/self/fd/{fd}") != address.link() or os.fstat(fd).st_size != address.bytes:
            return None
        return torch.frombuffer(mmap.mmap(fd, address.bytes, access=mmap.ACCESS_COPY), dtype=torch.uint8)
    except OSError:  # no address space for it here: over the group, like any peer that cannot map it
        return None
    finally:
        os.close(fd)
