"""Acting on a node's GPUs: the power cap (energy.power_cap_w) and DVFS clocks (energy.dvfs), always undone.

    controls = GpuControls(gpus, why_not, energy=cfg.energy, state_file=folder / f"gpu-state-{host}.json")
    controls.start()            # restore what a killed job left, check and apply the cap
    try: ... controls.enter("data") ... controls.enter("compute") ...
    finally: controls.restore()

Before changing anything it writes the driver's settings to `state_file`; `restore` puts them back and
deletes the file, and `start` restores from a file a killed job left. Where the driver refuses (no GPU,
no NVML, no permission), each action is recorded once with why it was not applied, and the policy's
clocks are still traced so the saving can be estimated.
"""

from __future__ import annotations

import json
import logging
import time
from pathlib import Path

from trainflow.atomic import write_json
from trainflow.config import EnergyConfig
from trainflow.energy.dvfs import clock_for
from trainflow.energy.nvml import NodeGpus
from trainflow.errors import ConfigError

log = logging.getLogger(__name__)


class GpuControls:
    def __init__(self, gpus: NodeGpus | None, why_not: str, *, energy: EnergyConfig, state_file: Path) -> None:
        self.gpus, self.why_not, self.energy, self.state_file = gpus, why_not, energy, state_file
        self.actions: list[str] = []
        """What was done, or what would have been and why not: one line each."""
        self.clock_mhz = energy.compute_clock_mhz
        self.last_data_s: float | None = None
        self.lowered = 0
        self.clocks_applied = False
        self.clocks_refused = ""
        self.changed = False
        """Whether any setting of the driver was changed (restore puts it back)."""
        self.data_started: float | None = None

    def start(self) -> None:
        if self.gpus is not None and self.state_file.exists():
            self.restore_from(self.gpus)
            self.actions.append(f"restored the GPU settings a killed job left ({self.state_file.name})")
        cap = self.energy.power_cap_w
        if not cap:
            return
        if self.gpus is None:
            self.refused(f"would have capped every GPU at {cap:g} W", self.why_not)
            return
        for i in range(len(self.gpus.handles)):
            low, high = self.gpus.power_limit_range_w(i)
            if not low <= cap <= high:
                raise ConfigError(
                    f"energy.power_cap_w({cap:g}) is outside GPU {i}'s allowed range {low:g}-{high:g} W (NVML); "
                    "choose a cap in that range, or 0 to keep the driver's limit"
                )
        self.save_state(self.gpus)
        try:
            for i in range(len(self.gpus.handles)):
                self.gpus.set_power_limit_w(i, cap)
                self.changed = True
        except self.gpus.nvml.NVMLError as err:
            self.refused(f"would have capped every GPU at {cap:g} W", f"NVML refused ({err})")
            return
        self.actions.append(f"capped {len(self.gpus.handles)} GPUs at {cap:g} W (nvmlDeviceSetPowerManagementLimit)")

    def enter(self, kind: str) -> None:
        """The trainer enters a phase (one of dvfs.PHASES): set the clock the policy gives it."""
        e, now = self.energy, time.perf_counter()
        if not e.dvfs:
            return
        if self.data_started is not None:  # a data phase just ended: the policy's memory
            self.last_data_s, self.data_started = now - self.data_started, None
        if kind == "data":
            self.data_started = now
        mhz = clock_for(
            kind,
            last_data_s=self.last_data_s,
            idle_mhz=e.idle_clock_mhz,
            compute_mhz=e.compute_clock_mhz,
            min_phase_s=e.dvfs_min_phase_s,
        )
        if mhz == self.clock_mhz:
            return
        self.lowered += mhz < e.compute_clock_mhz
        self.clock_mhz = mhz
        action = f"would have locked clocks at {e.idle_clock_mhz} MHz while data loads"
        if self.gpus is None or self.clocks_refused:
            self.refused(action, self.clocks_refused or self.why_not)
            return
        try:
            self.save_state(self.gpus)
            for i in range(len(self.gpus.handles)):
                self.gpus.lock_clocks_mhz(i, mhz)
                self.changed = True
        except self.gpus.nvml.NVMLError as err:
            self.clocks_refused = f"NVML refused ({err})"
            self.refused(action, self.clocks_refused)
            return
        if not self.clocks_applied:
            self.actions.append(
                f"locked clocks at {e.idle_clock_mhz} MHz while data loads, {e.compute_clock_mhz} MHz for compute "
                "(nvmlDeviceSetGpuLockedClocks)"
            )
        self.clocks_applied = True

    def refused(self, action: str, why: str) -> None:
        """Record (and log) an action the driver did not take, once."""
        if not self.changed:  # nothing to put back
            self.state_file.unlink(missing_ok=True)
        line = f"{action}; not applied: {why}"
        if line not in self.actions:
            self.actions.append(line)
            log.info("DVFS/power cap %s", line)

    def save_state(self, gpus: NodeGpus) -> None:
        """The driver's power limits before the first change (clocks are put back by a reset)."""
        if not self.state_file.exists():
            write_json(self.state_file, {"power_limit_w": [gpus.power_limit_w(i) for i in range(len(gpus.handles))]})

    def restore_from(self, gpus: NodeGpus) -> None:
        for i, watts in enumerate(json.loads(self.state_file.read_text())["power_limit_w"]):
            gpus.set_power_limit_w(i, watts)
            gpus.reset_clocks(i)
        self.state_file.unlink()

    def restore(self) -> None:
        """Put back the driver's power limits and clocks (every exit path calls it); forget the state file."""
        if self.gpus is None or not self.state_file.exists():
            return
        self.restore_from(self.gpus)
        self.actions.append("restored the driver's power limits and clocks at exit")
