"""scripts/gpu_check.sh's power step: GPU 0's power cap set to 80 % of its limit, read back and restored, and the
energy counter read before and after (trainflow.energy.nvml); one JSON, exit 1 where any of it did not hold.

    python scripts/gpu_check_steps/power.py
"""

from __future__ import annotations

import json
import sys

from trainflow.energy.nvml import NodeGpus


def check(gpus: NodeGpus) -> tuple[dict, bool]:
    """(what was set and read, whether the cap held and was restored and the counter moved forward)."""
    before, limit = gpus.energy_j(), gpus.power_limit_w(0)
    low, high = gpus.power_limit_range_w(0)
    cap = max(low, round(0.8 * limit))
    gpus.set_power_limit_w(0, cap)
    capped = gpus.power_limit_w(0)
    gpus.set_power_limit_w(0, limit)
    restored, after = gpus.power_limit_w(0), gpus.energy_j()
    found = {"limit_w": limit, "range_w": [low, high], "set_w": cap, "read_back_w": capped, "restored_w": restored,
             "energy_j": [before, after]}  # fmt: skip
    return found, capped == cap and restored == limit and bool(after) and after[0] >= before[0]


def main() -> int:
    gpus, why = NodeGpus.open()
    if gpus is None:
        print(f"gpu_check: {why}", file=sys.stderr)
        return 1
    try:
        found, held = check(gpus)
    finally:
        gpus.close()
    print(json.dumps(found))
    return 0 if held else 1


if __name__ == "__main__":
    sys.exit(main())
