"""A failure the seed's troubleshooting guide covers names its remedy in the one error line."""

from __future__ import annotations

import pytest

from trainflow.launch.failure import remedy


@pytest.mark.parametrize(
    ("what", "names"),
    [
        (
            "raised torch.distributed.DistBackendError: [Rank 1] Watchdog caught collective operation timeout",
            ("NCCL_DEBUG=INFO", "collective_timeout_s", "RDMA"),
        ),
        ("raised RuntimeError: [../gloo/transport/tcp/pair.cc:534] Timed out waiting 300000ms", ("NCCL_DEBUG=INFO",)),
        ("raised torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB", ("CUDA_LAUNCH_BLOCKING=1",)),
    ],
)
def test_known_failures_name_the_seeds_remedy(what, names):
    hint = remedy(what)
    assert hint.startswith("; the seed's remedy") and all(name in hint for name in names)
    assert "\n" not in hint


def test_other_failures_get_no_remedy():
    assert remedy("raised ValueError: step 3 loss is nan") == ""
    assert remedy("was killed by SIGKILL") == ""
