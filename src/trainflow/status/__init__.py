"""Where a campaign stands, read from its run folder alone: segments done and in flight, the current step and
tokens/s, the newest complete checkpoint, failures and restarts with their verdicts, excluded hosts, goodput so far
and an ETA from the measured step time. Nothing here imports torch: it runs on a login node while training runs.

    python -m trainflow.status runs/default            # --json for scripts, --watch to refresh
"""
