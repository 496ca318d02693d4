"""The exchange of a single read (checkpoint.exchange_rounds): how the reader cuts a file's asked ranges into pieces
and rounds, and that its phases let disjoint pairs of ranks exchange at once, N - 1 of them where each of N ranks reads
a file all the others need, every message's two ends in the same phase. Built with the module's own functions, no
processes; tests/unit/test_single_read.py runs the exchange on gloo ranks."""

from __future__ import annotations

from trainflow.checkpoint.agreement import pieces_to
from trainflow.checkpoint.exchange_rounds import ROUND_BYTES, Piece, phases, pieces
from trainflow.checkpoint.load_plan import FileShare


def test_a_files_asked_ranges_go_merged_and_cut_at_half_a_round_to_the_ranks_that_asked_for_them():
    reads = (FileShare("f", 200, 0, (1, 2)), FileShare("g", 50, 0, (2,)))
    asked = {1: {"f": [(0, 10), (10, 5)]}, 2: {"f": [(2, 6), (100, 30)], "g": []}}
    assert pieces(reads, asked, 32) == [  # rounds of at most 16 bytes: one the reader sends, one a receiver takes
        Piece("f", 0, 10, (0, 1, 2), 0),
        Piece("f", 10, 5, (0, 1), 0),
        Piece("f", 100, 16, (0, 2), 1),
        Piece("f", 116, 14, (0, 2), 2),
    ]


def test_the_exchange_runs_in_n_minus_1_phases_each_a_transfer_between_disjoint_pairs():
    """Each of 64 ranks (the seed's dp64) reads one file that all others need: every rank goes through 63 phases, the
    same 63 on every rank, and in each sends one file to one rank and receives one from another, the two ends of each
    message in the same phase: the exchange takes 63 file-times, where one global order of messages (by file, offset,
    receiver, each message waiting for those before it at both its ends, as on NCCL's stream) took 2924."""
    n, size = 64, 1 << 20
    reads = [(FileShare(f"__{r}_0.distcp", size, r, tuple(q for q in range(n) if q != r)),) for r in range(n)]
    told = [
        pieces_to(reads[r], {q: {reads[r][0].name: [(0, size)]} for q in range(n) if q != r}, ROUND_BYTES)
        for r in range(n)
    ]
    mine = [told[r][0] + [p for q in range(n) if q != r for p in told[q][1][r]] for r in range(n)]
    schedules = [phases(mine[r], r, n) for r in range(n)]
    assert {len(s) for s in schedules} == {n - 1}
    keys = {(ph.round, ph.distance) for s in schedules for ph in s}
    assert len(keys) == n - 1  # the phases every rank goes through in one order: the exchange's critical path
    for r, s in enumerate(schedules):
        for ph in s:
            assert [p.name for p in ph.sends] == [reads[r][0].name]  # one file out, to one rank
            assert [p.members[0] for p in ph.receives] == [(r - ph.distance) % n]  # one file in, from one rank
            peer = next(x for x in schedules[(r + ph.distance) % n] if (x.round, x.distance) == (ph.round, ph.distance))
            assert peer.receives == ph.sends  # what this rank sends in the phase its receiver takes in the same
    phased = sum(
        max(sum(p.nbytes for p in ph.sends) for s in schedules for ph in s if (ph.round, ph.distance) == k)
        for k in keys
    )
    done = [0] * n  # one message at a time in one global order: each waits for both its ends' messages before it
    for p in sorted((p for r in range(n) for p in told[r][0]), key=lambda p: (p.name, p.start)):
        for q in p.members[1:]:
            done[p.members[0]] = done[q] = max(done[p.members[0]], done[q]) + p.nbytes
    assert phased == (n - 1) * size and max(done) >= n * n // 2 * size  # 63 file-times against 2924
