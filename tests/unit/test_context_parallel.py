"""Context parallel's layout rules and chunks (config.layout) and its mask (parallel.context), on one process."""

from __future__ import annotations

import pytest
import torch

from trainflow.config import ParallelDims, compose
from trainflow.config.layout import cp_chunks
from trainflow.errors import ConfigError
from trainflow.parallel.context import gathered_mask


@pytest.mark.parametrize("cp", [1, 2, 4])
def test_the_chunks_split_every_position_once_and_the_causal_work_evenly(cp):
    seq = 32
    ranks = [cp_chunks(seq, cp, r) for r in range(cp)]
    assert sorted(p for positions in ranks for p in positions) == list(range(seq))
    assert len({sum(p + 1 for p in positions) for positions in ranks}) == 1  # keys each rank's queries attend
    assert ranks[0][: seq // (2 * cp)] == list(range(seq // (2 * cp)))  # rank 0 holds the first chunk, then the last
    assert ranks[0][-1] == seq - 1


@pytest.mark.parametrize("cp", [2, 4])
def test_the_mask_is_the_causal_mask_by_global_positions(cp):
    """Put back in sequence order (queries and gathered keys), every rank's mask rows are one process's causal rows."""
    seq = 16
    causal = torch.ones(seq, seq, dtype=torch.bool).tril()
    keys = torch.tensor([p for r in range(cp) for p in cp_chunks(seq, cp, r)])
    for rank in range(cp):
        queries = torch.tensor(cp_chunks(seq, cp, rank))
        mask = gathered_mask(seq, cp, rank, torch.device("cpu"))
        assert torch.equal(mask, causal[queries][:, keys])


@pytest.mark.parametrize(
    ("overrides", "fragment"),
    [
        (["parallel=cp2", "model.seq_len=126"], "model.seq_len(126) is not divisible by 2 * cp(2) = 4 load-balanced"),
        (
            ["parallel=dp2_shard_cp2", "parallel.dp=64", "train.global_batch=64", "cluster.allocation.nodes=1"],
            "sharding over 64 x cp(2) ranks splits wk and wv into fewer rows (64) than ranks",
        ),
    ],
)
def test_a_layout_that_cannot_hold_cp_is_refused_in_one_line(overrides, fragment):
    with pytest.raises(ConfigError) as err:
        compose("train_segment", overrides)
    assert fragment in str(err.value)
    assert "\n" not in str(err.value)


def test_the_world_counts_cp():
    assert compose("train_segment", ["parallel=dp2_cp2"]).parallel.world_size == 4
    with pytest.raises(ConfigError, match=r"dp\(2\) \* cp\(2\) \* tp\(1\) \* pp\(1\) = 4 != world_size\(2\)"):
        ParallelDims(dp=2, tp=1, pp=1, cp=2, world_size=2)
