"""A hung job's Flight Recorder dumps read side by side: the collective the ranks wait in, and who did not enter it.

    python -c "from trainflow.resilience.flight import read_dumps, stuck; print(stuck(read_dumps('logs', '42')))"

torch's Flight Recorder keeps, on every rank, the last TORCH_FR_BUFFER_SIZE collectives of each process group it
belongs to (NCCL and gloo alike): the group, the collective's sequence number in it, its op ("nccl:all_reduce"), the
input sizes and dtypes, and its state: scheduled (the rank issued it), started (on the device; NCCL with
TORCH_NCCL_ENABLE_TIMING=1 records when) and completed. When a job hangs, every live rank writes its recorder as
JSON beside the job's logs (launch.hang.dump_stacks, through torch's own `_dump_fr_trace_json`). This module reads
them as torch's fr_trace analyser reads its pickles, without unpickling anything: the dumps are files of the run
folder, possibly hostile, and a pickle runs code. A dump that does not read is left out and named.

Per process group, the newest collective any member issued is the one the others wait in; a member whose newest
entry of that group is older did not enter it, and is named with what it last issued there. Where every member
issued it but some never started it on the device (timing on), those are named: the stall is on their GPU's side.
This names the collective the heartbeat's counts (resilience.hang) only number; the counts stay the verdict's
evidence, as they come from every rank alive or stopped, and a stopped rank writes no dump.

At scale the full dumps are not what is read: 4096 ranks' recorders of 20,000 entries are ~50 GB of JSON (the better
part of an hour to parse in one process after every hang). Each rank reduces its own dump as it writes it
(`newest_rows`: each group's newest collective, all `stuck` compares) to `<job>_<rank>_flight_newest.json` of a few
hundred bytes, in the dump's own form, and `read_dumps` reads that where it is there: ~1 MB for 4096 ranks
(tests/unit/test_flight.py::test_four_thousand_ranks_are_judged_from_their_digests_alone). The full dumps stay
beside them for a person and torch's fr_trace.
"""

from __future__ import annotations

import glob
import json
import re
from dataclasses import dataclass
from pathlib import Path

from trainflow.records import RecordError, read_json

DUMP_BYTES = 1 << 26
"""More than any dump of 20000 entries (~600 bytes each, about 12 MB): a bigger file is not read."""
DIGEST_BYTES = 1 << 20
"""More than any rank's digest (a few entries of ~300 bytes for each process group it belongs to)."""
NAME = re.compile(r"^(?P<job>[\w.-]+)_(?P<rank>\d{1,7})_flight(?P<newest>_newest)?\.json$")
FIX = "it is not a Flight Recorder dump trainflow wrote (launch.hang.dump_stacks); the hang's other evidence stands"


@dataclass(frozen=True)
class Entry:
    """One collective a rank issued, as its recorder kept it."""

    group: str
    """The process group's name, the same on every member (its description, such as mesh_tp, is shared by every group
    of a mesh dimension), with the description beside it: "3 (mesh_tp)"."""
    seq: int
    op: str
    sizes: str
    """Its input sizes and dtypes, e.g. "Float[4096, 8192]"."""
    state: str
    """scheduled, started or completed."""


@dataclass(frozen=True)
class Stuck:
    """What the dumps show of one process group: the collective waited in, who waits in it, who did not issue it or
    did not start it, and which dumps did not read."""

    group: str
    seq: int
    op: str
    sizes: str
    waiting: tuple[int, ...]
    behind: dict[int, int]
    """Rank -> the newest sequence number it issued in the group (a member whose recorder holds none of the group's
    collectives is not compared: its dump cannot tell it from a rank outside the group)."""
    not_started: tuple[int, ...] = ()
    unread: tuple[str, ...] = ()

    def line(self) -> str:
        what = f"{self.op} #{self.seq} of process group {self.group} ({self.sizes})"
        ranks = ", ".join(map(str, self.waiting))
        if self.behind:
            late = "; ".join(f"rank {r} issued up to #{n}" for r, n in sorted(self.behind.items()))
            waits = f"ranks {ranks} wait" if len(self.waiting) > 1 else f"rank {ranks} waits"
            said = f"Flight Recorder: {waits} in {what}, which {late}"
        else:
            idle = ", ".join(map(str, self.not_started))
            said = f"Flight Recorder: every rank issued {what}; rank{'s' * (len(self.not_started) > 1)} {idle} never "
            said += "started it on the device"
        more = f"; {len(self.unread) - 2} more dumps left out" if len(self.unread) > 2 else ""
        return said + (f" ({'; '.join(self.unread[:2])}{more})" if self.unread else "")


def entries_of(dump: object, where: str) -> list[Entry]:
    """The collectives of one dump (point-to-point ones left out: a pipeline's sends count on two ranks only)."""
    if not isinstance(dump, dict) or not isinstance(rows := dump.get("entries", []), list):
        raise RecordError(f"{where} holds no list of entries; {FIX}")
    found = []
    for row in rows:
        try:
            if row.get("is_p2p", False):
                continue
            group, seq = row["process_group"], row["collective_seq_id"]
            dtypes, sizes = row.get("input_dtypes", []), row.get("input_sizes", [])
            valid = isinstance(group, list) and len(group) == 2 and all(isinstance(g, str) for g in group)
            valid = valid and type(seq) is int and 0 <= seq < 2**63 and isinstance(row["state"], str)
            valid = valid and isinstance(row["profiling_name"], str) and isinstance(dtypes, list)
            if not (valid and isinstance(sizes, list) and all(isinstance(s, list) for s in sizes)):
                raise TypeError
            shapes = ", ".join(f"{d}{list(s)}" for d, s in zip(dtypes, sizes, strict=False))
            name = f"{group[0]} ({group[1]})" if group[1] else group[0]
            found.append(
                Entry(
                    printable(name, 80),
                    seq,
                    printable(row["profiling_name"], 80),
                    printable(shapes, 200),
                    printable(row["state"], 20),
                )
            )
        except (AttributeError, KeyError, TypeError):
            raise RecordError(
                f"{where} has an entry that is not a collective's record ({printable(repr(row), 80)}); {FIX}"
            ) from None
    return found


def read_dumps(folder: str | Path, job: str) -> tuple[dict[int, list[Entry]], list[str]]:
    """Every rank's entries from the job's dumps in `folder`: its digest (`<job>_<rank>_flight_newest.json`) where it
    wrote one, else its full dump (`<job>_<rank>_flight.json`); and a line for each that does not read."""
    chosen: dict[int, Path] = {}
    for path in sorted(Path(folder).glob(f"{glob.escape(job)}_*_flight*.json")):
        if (m := NAME.match(path.name)) and m["job"] == job and (m["newest"] or int(m["rank"]) not in chosen):
            chosen[int(m["rank"])] = path  # "..._flight.json" sorts before "..._flight_newest.json"
    dumps, unread = {}, []
    for rank, path in sorted(chosen.items()):
        limit = DIGEST_BYTES if path.name.endswith("_newest.json") else DUMP_BYTES
        try:
            dumps[rank] = entries_of(read_json(path, fix=FIX, limit=limit), str(path))
        except (RecordError, OSError) as err:
            unread.append(f"rank {rank}'s dump left out: {err}")
    return dumps, unread


def newest_rows(dump: dict) -> dict:
    """A rank's dump (torch's JSON, parsed) reduced to each process group's newest collective, in the dump's form:
    what `stuck` compares of it. Run by the rank on its own dump as it writes it (launch.hang.dump_stacks)."""
    newest: dict[str, dict] = {}
    for row in dump.get("entries", []):
        if not row.get("is_p2p", False):
            key = json.dumps(row["process_group"])
            if key not in newest or row["collective_seq_id"] >= newest[key]["collective_seq_id"]:
                newest[key] = row
    return {"version": dump.get("version"), "entries": list(newest.values())}


def printable(text: str, limit: int) -> str:
    """`text` cut to `limit` characters, anything outside printable ASCII as "?": it reaches a one-line error."""
    return re.sub(r"[^\x20-\x7e]", "?", text[:limit])


def stuck(read: tuple[dict[int, list[Entry]], list[str]]) -> Stuck | None:
    """The group whose newest collective the most ranks wait in while others did not issue it (else, one that every
    rank issued and some never started); None where the dumps show neither (or there are none)."""
    dumps, unread = read
    newest: dict[str, dict[int, Entry]] = {}
    for rank, entries in dumps.items():
        for e in entries:
            last = newest.setdefault(e.group, {})
            if rank not in last or e.seq >= last[rank].seq:
                last[rank] = e
    candidates = []
    for group, last in newest.items():
        top = max(e.seq for e in last.values())
        ahead = next(e for e in last.values() if e.seq == top)
        waiting = tuple(sorted(r for r, e in last.items() if e.seq == top))
        behind = {r: e.seq for r, e in last.items() if e.seq < top}
        idle = tuple(r for r in waiting if last[r].state == "scheduled")
        if behind or (idle and len(idle) < len(waiting)):
            stalled = Stuck(group, top, ahead.op, ahead.sizes, waiting, behind, () if behind else idle, tuple(unread))
            candidates.append((not behind, -len(waiting), group, stalled))
    return min(candidates, key=lambda c: c[:3])[3] if candidates else None
