"""python -m trainflow.status runs/<run> [--json] [--watch [SECONDS]] [--checkpoints DIR]

Where a campaign stands, from its run folder alone (trainflow.status.read): on the login node while it runs, without
torch. Exit status: 0 with the status printed; 3, in one line, for a run folder whose training has not started (its
data is prepared, staged or gated first: ask again later; --watch waits for it); 1, in one line naming the file, for
a folder that is no run folder or does not read; 2 for a command line argparse refuses.
"""

from __future__ import annotations

import argparse
import sys
import time

from trainflow.arguments import positive
from trainflow.errors import TrainflowError
from trainflow.status.read import NotStartedError, State, read_status
from trainflow.status.show import as_json, clean, render

NOT_STARTED = 3
"""The exit status for a run folder whose training has not started, which a polling script tells from a failure."""
UNREADABLE = (TrainflowError, OSError, ValueError, RecursionError, OverflowError)
"""What a hostile or half-written run folder raises while it is read (a RecordError is a TrainflowError)."""
CLEAR = "\033[H\033[J"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m trainflow.status", description=__doc__.split("\n\n")[1])
    parser.add_argument("folder", help="the run folder: runs/<run> (storage.root)")
    parser.add_argument("--json", action="store_true", help="one JSON object, for scripts")
    parser.add_argument(
        "--watch",
        type=positive("--watch", "seconds", "10"),
        nargs="?",
        const=10.0,
        metavar="SECONDS",
        help="refresh (default 10 s)",
    )
    parser.add_argument("--checkpoints", help="the checkpoint folder, when it lies outside the run folder")
    args = parser.parse_args(argv)
    terminal = sys.stdout.isatty()
    while True:
        try:
            status = read_status(args.folder, checkpoints=args.checkpoints)
        except NotStartedError as err:  # --watch waits for its training to start
            print(f"trainflow.status: {clean(str(err), limit=2000)}", file=sys.stderr)
            if args.watch is None:
                return NOT_STARTED
            status = None
        except UNREADABLE as err:
            print(f"trainflow.status: {clean(str(err), limit=2000)}", file=sys.stderr)
            return 1
        if status is not None:
            text = as_json(status) if args.json else render(status, bar=terminal)
            print(CLEAR + text if args.watch and terminal and not args.json else text, flush=True)
            if args.watch is None or status.state is State.FINISHED:
                return 0
        try:
            time.sleep(args.watch)
        except KeyboardInterrupt:
            return 0


if __name__ == "__main__":
    sys.exit(main())
