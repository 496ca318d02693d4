"""The Flight Recorder's dumps read side by side (resilience.flight): the collective the ranks wait in and who did not
issue it or start it, from crafted dumps in the shape torch's `_dump_fr_trace_json` writes (the stall drill in
tests/integration/test_restarts.py reads real ones), and hostile dumps left out in one line each."""

from __future__ import annotations

import json
import os

import pytest

from trainflow.resilience.flight import newest_rows, read_dumps, stuck


def entry(seq: int, *, group=("3", "mesh_tp"), op="nccl:all_reduce", state="scheduled", p2p=False) -> dict:
    return {
        "collective_seq_id": seq,
        "process_group": list(group),
        "profiling_name": op,
        "state": state,
        "input_dtypes": ["BFloat16"],
        "input_sizes": [[4096, 8192]],
        "is_p2p": p2p,
    }


def dump(folder, job: str, rank: int, entries: list[dict]) -> None:
    (folder / f"{job}_{rank}_flight.json").write_text(json.dumps({"version": "2.10", "entries": entries}))


def test_the_rank_that_did_not_issue_the_collective_is_named_with_what_it_last_issued(tmp_path):
    for rank in (0, 2, 3):
        dump(tmp_path, "42", rank, [entry(n) for n in range(1, 8)])
    dump(tmp_path, "42", 1, [entry(n) for n in range(1, 7)] + [entry(9, p2p=True)])  # a pipeline send: not counted
    found = stuck(read_dumps(tmp_path, "42"))
    assert found.line() == (
        "Flight Recorder: ranks 0, 2, 3 wait in nccl:all_reduce #7 of process group 3 (mesh_tp) "
        "(BFloat16[4096, 8192]), which rank 1 issued up to #6"
    )


def test_every_rank_issued_it_and_one_never_started_it_on_the_device(tmp_path):
    for rank in (0, 1):
        dump(tmp_path, "42", rank, [entry(1, state="completed"), entry(2, state="started")])
    dump(tmp_path, "42", 2, [entry(1, state="completed"), entry(2, state="scheduled")])
    line = stuck(read_dumps(tmp_path, "42")).line()
    assert line.endswith(
        "nccl:all_reduce #2 of process group 3 (mesh_tp) (BFloat16[4096, 8192]); rank 2 never started it on the device"
    )


def test_groups_of_one_mesh_dimension_are_not_compared_and_a_level_job_names_nobody(tmp_path):
    """Two tp groups share the description mesh_tp: one at collective 9, the other at 7, each level inside."""
    for rank, (name, top) in enumerate([("3", 9), ("3", 9), ("4", 7), ("4", 7)]):
        dump(tmp_path, "42", rank, [entry(n, group=(name, "mesh_tp")) for n in range(1, top + 1)])
    assert stuck(read_dumps(tmp_path, "42")) is None
    assert stuck(read_dumps(tmp_path, "43")) is None  # no dumps at all


@pytest.mark.parametrize(
    ("content", "why"),
    [
        ("{not json", "is not readable JSON"),
        ('{"entries": 7}', "holds no list of entries"),
        ('{"entries": ["a\\nline"]}', "an entry that is not a collective's record ('a\\nline')"),
        (json.dumps({"entries": [{**entry(1), "collective_seq_id": "7"}]}), "not a collective's record"),
        (json.dumps({"entries": [{**entry(1), "process_group": "0"}]}), "not a collective's record"),
        ("[" * 100_000 + "]" * 100_000, "JSON"),
    ],
    ids=["not-json", "entries-not-a-list", "entry-a-string", "seq-a-string", "group-a-string", "deep"],
)
def test_a_hostile_dump_is_left_out_in_one_line_and_the_others_still_read(tmp_path, content, why):
    dump(tmp_path, "42", 0, [entry(1), entry(2)])
    dump(tmp_path, "42", 1, [entry(1)])
    (tmp_path / "42_2_flight.json").write_text(content)
    found = stuck(read_dumps(tmp_path, "42"))
    assert found.behind == {1: 1} and len(found.unread) == 1
    assert found.unread[0].startswith("rank 2's dump left out:") and why in found.unread[0], found.unread
    assert "\n" not in found.line()


def test_a_fifo_a_huge_file_and_control_characters_never_reach_the_line(tmp_path):
    os.mkfifo(tmp_path / "42_1_flight.json")  # opened without waiting for a writer
    with open(tmp_path / "42_2_flight.json", "wb") as f:
        f.truncate((1 << 26) + 1)  # past DUMP_BYTES
    dump(tmp_path, "42", 0, [entry(1, op="nccl:all_reduce\x1b[2J\n"), entry(2, op="nccl:all_reduce\x1b[2J\n")])
    dump(tmp_path, "42", 3, [entry(1)])
    (tmp_path / "42_x_flight.json").write_text("{}")  # not a rank's name: not read
    found = stuck(read_dumps(tmp_path, "42"))
    assert "nccl:all_reduce?[2J?" in found.line() and "\x1b" not in found.line()
    assert [u.split(":")[0] for u in found.unread] == ["rank 1's dump left out", "rank 2's dump left out"]
    assert "FIFO" in found.unread[0] and "more than" in found.unread[1]


def test_thousands_of_hostile_dumps_cost_the_line_two_reasons_and_a_count(tmp_path):
    dump(tmp_path, "42", 0, [entry(1), entry(2)])
    dump(tmp_path, "42", 1, [entry(1)])
    for rank in range(2, 2002):
        (tmp_path / f"42_{rank}_flight.json").write_text("{")
    line = stuck(read_dumps(tmp_path, "42")).line()
    assert line.count("dump left out") == 2 and line.endswith("; 1998 more dumps left out)") and len(line) < 1000


def test_a_ranks_digest_is_read_in_place_of_its_dump_and_judges_the_same(tmp_path):
    """newest_rows keeps each group's newest collective: stuck() gives the same line from the digests alone."""
    full = {
        0: [entry(s) for s in range(1, 50)] + [entry(7, group=("5", "mesh_dp"))],
        1: [entry(s) for s in range(1, 48)],
    }
    for rank, entries in full.items():
        dump(tmp_path, "42", rank, entries)
    line = stuck(read_dumps(tmp_path, "42")).line()
    for rank, entries in full.items():
        digest = newest_rows({"version": "2.10", "entries": entries})
        assert [e["collective_seq_id"] for e in digest["entries"]] == ([49, 7] if rank == 0 else [47])
        (tmp_path / f"42_{rank}_flight_newest.json").write_text(json.dumps(digest))
        (tmp_path / f"42_{rank}_flight.json").write_text("{")  # the full dump is not read where the digest is
    assert stuck(read_dumps(tmp_path, "42")).line() == line
    assert (
        "rank 0 waits in nccl:all_reduce #49 of process group 3 (mesh_tp)" in line and "rank 1 issued up to #47" in line
    )


def test_four_thousand_ranks_are_judged_from_their_digests_alone(tmp_path):
    """The seed's 4096 ranks: each rank's digest a few hundred bytes (its tp, dp and pp groups' newest collective),
    rank 1234 one all_reduce behind in its tp group; the line names it, having read ~1 MB."""
    for rank in range(4096):
        tp, dp = (str(rank // 8), "mesh_tp"), (str(4096 + rank % 8), "mesh_dp")
        rows = [entry(100 - (rank == 1234), group=tp), entry(30, group=dp, op="nccl:reduce_scatter")]
        (tmp_path / f"7_{rank}_flight_newest.json").write_text(json.dumps({"version": "2.10", "entries": rows}))
    read = sum(p.stat().st_size for p in tmp_path.iterdir())
    assert read < 2 << 20
    line = stuck(read_dumps(tmp_path, "7")).line()
    assert line.startswith(
        "Flight Recorder: ranks 1232, 1233, 1235, 1236, 1237, 1238, 1239 wait in nccl:all_reduce #100"
    )
    assert line.endswith("which rank 1234 issued up to #99")
