"""The seed's energy arithmetic as a command: campaign energy, tokens per joule per GPU, DVFS saving, carbon.

    python -m trainflow.energy.estimate                      # the seed: 4096 GPUs x 560 W x 2160 h, PUE 1.05
    python -m trainflow.energy.estimate --gpus 512 --hours 720 energy.pue=1.2 energy.grid_gco2_per_kwh=400

Watts, PUE, grid intensity and the DVFS clocks come from the Hydra `energy` group (overrides as for any
stage); GPUs and hours are arguments, with the seed's campaign as defaults. The seed's 8 % DVFS saving is
printed beside what the stated power model (dvfs.IDLE_CLOCK_POWER_SHARE) needs for it: the share of time
spent loading data at the idle clock.
"""

from __future__ import annotations

import argparse
import sys

from trainflow.config import EnergyConfig, compose
from trainflow.energy.accounting import campaign_gwh
from trainflow.energy.dvfs import IDLE_CLOCK_POWER_SHARE
from trainflow.errors import TrainflowError

SEED_GPUS, SEED_HOURS = 4096, 2160.0
SEED_DVFS_SAVING = 0.08
"""The seed: dropping clocks below 500 MHz while data loads saves a further 8 %."""
SEED_TABLE = (
    ("baseline", 580.0, 520.0),
    ("+ vBoost 1.8 GHz", 650.0, 560.0),
    ("+ FP8", 723.0, 530.0),
)
"""The seed's GH200 tuning table: (setting, tokens/s per GPU, watts per GPU)."""


def tokens_per_joule(tokens_per_s: float, watts: float) -> float:
    return tokens_per_s / watts


def estimate(*, gpus: int, hours: float, energy: EnergyConfig, dvfs_saving: float) -> dict:
    """The campaign's figures before and after PUE, with the DVFS saving and carbon (module docstring)."""
    it_gwh = campaign_gwh(gpus=gpus, watts=energy.gpu_watts, hours=hours)
    facility_gwh = it_gwh * energy.pue
    after_dvfs_gwh = facility_gwh * (1 - dvfs_saving)
    return {
        "gpus": gpus,
        "hours": hours,
        "watts": energy.gpu_watts,
        "it_gwh": it_gwh,
        "facility_gwh": facility_gwh,
        "pue": energy.pue,
        "dvfs_saving": dvfs_saving,
        "dvfs_saved_gwh": facility_gwh - after_dvfs_gwh,
        "dvfs_data_share": dvfs_saving / (1 - IDLE_CLOCK_POWER_SHARE),
        "after_dvfs_gwh": after_dvfs_gwh,
        "grid_gco2_per_kwh": energy.grid_gco2_per_kwh,
        "co2_t": after_dvfs_gwh * energy.grid_gco2_per_kwh,  # 1 GWh at 1 g/kWh is 1 t
        "table": [
            {"setting": name, "tokens_per_s": tps, "watts": w, "tokens_per_joule": tokens_per_joule(tps, w)}
            for name, tps, w in SEED_TABLE
        ],
    }


def render(e: dict) -> str:
    rows = "\n".join(
        f"  {r['setting']:<18} {r['tokens_per_s']:6.0f} tokens/s / {r['watts']:4.0f} W = {r['tokens_per_joule']:.3f} "
        f"tokens/J per GPU ({r['tokens_per_joule'] / e['table'][0]['tokens_per_joule'] - 1:+.1%} vs baseline)"
        for r in e["table"]
    )
    return (
        f"campaign: {e['gpus']} GPUs x {e['watts']:g} W x {e['hours']:g} h = {e['it_gwh']:.2f} GWh IT (before PUE)\n"
        f"facility: x PUE {e['pue']:g} = {e['facility_gwh']:.2f} GWh\n"
        f"DVFS: -{e['dvfs_saving']:.0%} = -{e['dvfs_saved_gwh']:.2f} GWh -> {e['after_dvfs_gwh']:.2f} GWh (estimate; "
        f"with {IDLE_CLOCK_POWER_SHARE:.0%} of the power at the idle clock it takes {e['dvfs_data_share']:.1%} of the "
        "time loading data at that clock)\n"
        f"carbon: {e['after_dvfs_gwh']:.2f} GWh x {e['grid_gco2_per_kwh']:g} g/kWh = {e['co2_t']:.0f} t CO2\n"
        f"tokens per joule (the seed's table):\n{rows}\n"
    )


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m trainflow.energy.estimate", description=__doc__.splitlines()[0])
    ap.add_argument("--gpus", type=int, default=SEED_GPUS, help=f"GPUs in the campaign (seed: {SEED_GPUS})")
    ap.add_argument("--hours", type=float, default=SEED_HOURS, help=f"campaign hours (seed: {SEED_HOURS:g})")
    ap.add_argument("--dvfs-saving", type=float, default=SEED_DVFS_SAVING, help="share saved by DVFS (seed: 0.08)")
    ap.add_argument("overrides", nargs="*", help="Hydra overrides of the energy group, e.g. energy.pue=1.2")
    args = ap.parse_args(argv)
    try:
        for name, value, ok, rule in (
            ("--gpus", args.gpus, args.gpus >= 1, ">= 1"),
            ("--hours", args.hours, args.hours > 0, "> 0"),
            ("--dvfs-saving", args.dvfs_saving, 0 <= args.dvfs_saving < 1, "a share in [0, 1)"),
        ):
            if not ok:
                raise TrainflowError(f"{name}({value:g}) must be {rule}")
        energy = compose("account_energy", args.overrides).energy
    except TrainflowError as err:
        print(f"trainflow.energy.estimate: {err}", file=sys.stderr)
        return 1
    sys.stdout.write(render(estimate(gpus=args.gpus, hours=args.hours, energy=energy, dvfs_saving=args.dvfs_saving)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
