"""Plan a training run before submitting it: memory, step split, throughput, checkpoint interval, energy.

    python -m trainflow.plan experiment=llama70b_alps train.precision=bf16 train.activations=recompute
    python -m trainflow.plan --json parallel=dp2_tp2_pp2
    python -m trainflow.plan experiment=llama70b_alps_campaign   # every phase's plan and the campaign's total
    python -m trainflow.plan --from-run runs/default      # a finished run's goodput, planned from its own terms
    python -m trainflow.plan --hardware-from runs/default experiment=smoke   # the cluster values that run measured

Takes the Hydra overrides training takes (composed as train_segment composes them) and prints the plan
as a table, or with --json as one JSON object on stdout. A bad override is one error line and exit 1; so is a plan
that does not fit in device memory (printed first, then the line that would stop validate_nccl), a local world this
machine cannot hold (trainflow.preflight.local_world_errors), and a campaign that cannot finish at the configured MTBF
(the line that says why). A config with phases (config.phases) is planned phase by phase (trainflow.plan.phases): each
phase's plan, then the campaign's total, or with --json {"phases": [...], "total": {...}}; a phase that cannot run is
one line naming it and exit 1; phase=<name> plans that phase alone, as a config without phases. With --from-run it
plans a run's goodput from the terms it measured (trainflow.plan.from_run) and prints it beside the measured one; a
run folder that does not read, or overrides given beside it (they would change nothing), is one line and exit 1.
With --hardware-from it prints, as overrides, the cluster values the run measured (trainflow.plan.measured_hardware),
solved through the plan of the run's own config (its overrides, given beside it): a later plan made with them, before
a run on the same machine, predicts that run's goodput.
"""

from __future__ import annotations

import argparse
import json
import sys

from trainflow.config import compose
from trainflow.errors import TrainflowError
from trainflow.plan.build import build_plan, refusal
from trainflow.plan.from_run import plan_run, read_terms, render_run_plan
from trainflow.plan.measured_hardware import as_overrides, measured_hardware
from trainflow.plan.phases import chooses_phase, plan_phases, render_phases
from trainflow.plan.table import render


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m trainflow.plan", description=__doc__.splitlines()[0])
    ap.add_argument("--json", action="store_true", help="print the plan as JSON")
    ap.add_argument("--from-run", metavar="RUN", help="plan a finished run's goodput from its own terms (runs/<run>)")
    ap.add_argument(
        "--hardware-from", metavar="RUN", help="print the cluster values a finished run measured, as overrides"
    )
    ap.add_argument("overrides", nargs="*", help="Hydra overrides, as for training (e.g. experiment=llama70b_alps)")
    args = ap.parse_args(argv)
    if args.from_run and args.overrides:  # the run's own terms are the plan's input: an override would change nothing
        print(
            f"trainflow.plan: --from-run plans from the run's measured terms and takes no overrides (given: "
            f"{' '.join(args.overrides)}); drop them, or plan them without --from-run",
            file=sys.stderr,
        )
        return 1
    if args.from_run:
        return from_run(args.from_run, as_json=args.json)
    if args.hardware_from:
        return hardware_from(args.hardware_from, args.overrides)
    try:
        cfg = compose("train_segment", args.overrides)
        if cfg.phases and not chooses_phase(args.overrides):
            return phases(args.overrides, [p.name for p in cfg.phases], as_json=args.json)
        plan = build_plan(cfg)
    except TrainflowError as err:
        print(f"trainflow.plan: {err}", file=sys.stderr)
        return 1
    sys.stdout.write(json.dumps(plan.to_json(), indent=1) + "\n" if args.json else render(plan, cfg.cluster.measured))
    if verdict := refusal(cfg, plan):
        print(f"trainflow.plan: {verdict}", file=sys.stderr)
        return 1
    return 0


def phases(overrides: list[str], names: list[str], *, as_json: bool) -> int:
    try:
        plan = plan_phases(overrides, names)
    except TrainflowError as err:
        print(f"trainflow.plan: {err}", file=sys.stderr)
        return 1
    sys.stdout.write(json.dumps(plan.to_json(), indent=1) + "\n" if as_json else render_phases(plan))
    return 0


def from_run(run: str, *, as_json: bool) -> int:
    try:
        plan = plan_run(read_terms(run))
    except TrainflowError as err:
        print(f"trainflow.plan: {err}", file=sys.stderr)
        return 1
    lines = [json.dumps(plan.to_json(), indent=1)] if as_json else render_run_plan(plan)
    sys.stdout.write("\n".join(lines) + "\n")
    return 0


def hardware_from(run: str, overrides: list[str]) -> int:
    try:
        values = measured_hardware(compose("train_segment", overrides), read_terms(run))
    except TrainflowError as err:
        print(f"trainflow.plan: {err}", file=sys.stderr)
        return 1
    print(" ".join(as_overrides(values)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
