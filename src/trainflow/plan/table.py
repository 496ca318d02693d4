"""The plan as a readable table (what `python -m trainflow.plan` prints without --json).

python -m trainflow.plan experiment=llama70b_alps train.precision=bf16 train.activations=recompute
"""

from __future__ import annotations

from dataclasses import asdict

from trainflow.config.cluster import GOODPUT_INPUTS
from trainflow.plan.build import Plan
from trainflow.plan.campaign import CampaignPlan
from trainflow.plan.goodput import GoodputPlan, Method, PeersGoodput
from trainflow.plan.remedies import Remedy
from trainflow.plan.seed import SeedComparison
from trainflow.plan.snapshots import SnapshotPlan
from trainflow.plan.startup import StartupPlan

GB = 1e9
PARTS = ("compute", "tp", "cp", "bubble", "activation", "dp", "optimizer")
LABELS = {
    "compute": "compute",
    "tp": "tp collectives (blocks, ends)",
    "cp": "cp K/V all-gather in blocks",
    "bubble": "pipeline bubble",
    "activation": "activation send/recv",
    "dp": "dp gradient reduction (exposed)",
    "optimizer": "optimizer step",
}
MARKS = {Method.SIMULATED: "", Method.EXPECTED: " exp."}
"""After a scenario's band: how it was found (a note says more)."""


def size(nbytes: float) -> str:
    """Bytes in GB, or MB below a GB (the tiny model's figures)."""
    return f"{nbytes / GB:9.2f} GB" if nbytes >= GB else f"{nbytes / 1e6:9.2f} MB"


def rows(title: str, pairs: list[tuple[str, str]]) -> list[str]:
    width = max(len(k) for k, _ in pairs)
    return [title, *(f"  {k:<{width}}  {v}" for k, v in pairs), ""]


def render(plan: Plan, measured: dict[str, str] | None = None) -> str:
    """The plan as the table `python -m trainflow.plan` prints; `measured`: cluster.measured, which goodput inputs a
    run at scale measured, and where."""
    su, d, mem, step, camp = plan.setup, plan.setup.layout, plan.memory, plan.step, plan.campaign
    schedule, cp = d.schedule if d.pp_enabled else "no pipeline", f"cp{d.cp} x " if d.cp > 1 else ""
    lines = [
        f"{su.model} ({camp.parameters / 1e9:.2f} B parameters) on {d.world_size} devices, dp{d.dp} x {cp}tp{d.tp} x "
        f"pp{d.pp}, {schedule} v={d.virtual_stages} m={d.microbatches}, {d.dp_mode}, {su.precision}, "
        f"activations={su.activations}, cluster {su.cluster}",
        "",
    ]
    lines += rows(
        f"Memory per device (pipeline rank {mem.pp_rank}, the fullest)",
        [
            ("weights (fp32)", size(mem.parameters)),
            ("gradients (fp32)", size(mem.gradients)),
            ("AdamW state (fp32)", size(mem.optimizer_state)),
            ("bf16 weight copies", size(mem.weight_copies)),
            ("activations in flight", size(mem.activations)),
            ("FSDP gathered", size(mem.gathered)),
            ("total / capacity", f"{size(mem.total)} of {size(plan.capacity_bytes).strip()}"),
        ],
    )
    if plan.overflow:
        lines += [f"OVERFLOW: {plan.overflow}", ""]
    seconds, shares = asdict(step.split), step.split.shares()
    lines += rows(
        "Step (the slowest pipeline rank)",
        [(LABELS[k], f"{seconds[k]:10.4f} s  {shares[k]:6.1%}") for k in PARTS if k != "cp" or d.cp > 1]
        + [
            ("step", f"{step.step_s:10.4f} s"),
            ("tokens/s/device", f"{step.tokens_per_s_per_device:10.1f}"),
            ("MFU", f"{step.mfu:10.1%}"),
        ],
    )
    lines += rows(
        "Checkpoint and campaign",
        [
            ("checkpoint", f"{size(camp.checkpoint_bytes).strip()}, written in {camp.save_s:.3g} s"),
            *checkpoint_rows(camp),
            ("campaign", f"{camp.steps} steps, {camp.tokens:.4g} tokens, {camp.hours:.4g} h"),
            ("energy", f"{camp.facility_gwh:.4g} GWh facility at {camp.watts_per_device:g} W/device"),
            ("tokens per joule", f"{camp.tokens_per_joule:.3g}"),
        ],
    )
    lines += goodput_lines(plan.goodput) + peers_lines(plan.goodput and plan.goodput.peers)
    lines += input_lines(plan.hardware, measured or {}, plan.startup)
    lines += startup_lines(plan.startup)
    lines += remedy_lines(plan.remedies) + seed_lines(plan.seed)
    return "\n".join(lines).rstrip() + "\n"


def input_lines(hardware: dict[str, float | str], measured: dict[str, str], startup: StartupPlan | None) -> list[str]:
    """Each input of the goodput plan, its value and whether a run at the campaign's scale measured it; a start-up
    the model sums says so (its parts are labelled one by one, startup_lines)."""
    lines = ["Goodput inputs (cluster.hardware; cluster.measured says which a run at scale measured)"]
    summed = {"startup_s": not startup.startup_set, "hot_restart_s": not startup.hot_restart_set} if startup else {}
    for name, unit in GOODPUT_INPUTS.items():
        where = f"measured at scale: {measured[name]}" if name in measured else "not measured at scale"
        if summed.get(name):
            where = f"the start-up's parts at {startup.world} ranks (below), each labelled"
        lines.append(f"  {name:<22} {hardware[name]:>10g} {unit:<5} {where}")
    return [*lines, ""]


def startup_lines(startup: StartupPlan | None) -> list[str]:
    """Each part of the start-up at the campaign's world size, its law and whether a run at that scale measured it;
    then the sums, or the values set that override them."""
    if startup is None or not startup.parts:
        return []
    lines = [f"Start-up at {startup.world} ranks (cluster.hardware.startup: {startup.fitted})"]
    width = max(len(p.law) for p in startup.parts)
    for p in startup.parts:
        where = f"measured at scale: {p.measured}" if p.measured else "not measured at scale"
        lines.append(f"  {p.part:<14} {seconds(p.seconds):>8}  {p.law:<{width}}  {where}")
    for name, hot, value, overridden, what in (
        ("startup_s", False, startup.startup_s, startup.startup_set, "a new job's: every part but the verdict"),
        ("hot_restart_s", True, startup.hot_restart_s, startup.hot_restart_set, "a hot restart's: every part"),
    ):
        total = startup.summed(hot=hot)
        said = f"set to {seconds(value)}, which overrides the parts' sum" if overridden else "the plan's"
        lines.append(f"  {name:<14} {seconds(total):>8}  {what}; {said}")
    return [*lines, ""]


def seconds(s: float) -> str:
    return f"{s:.0f} s" if s >= 100 else f"{s:.3g} s"


def goodput_lines(g: GoodputPlan | None) -> list[str]:
    if g is None:
        return ["Goodput under failures: not simulated, the plan does not fit", ""]
    lines = [
        f"Goodput under failures (MTBF {g.mtbf_s / 3600:.3g} h, {g.productive_s / 3600:.4g} h of steps, {g.trials} "
        f"seeded trials; goal {g.goal:.0%})",
        f"  {'scenario':<27} {'C':>10} {'tau':>8} {'D':>8} {'R':>8}  {'simulated mean (5-95 %)':<24} closed form",
    ]
    for s in g.scenarios:
        times = " ".join(
            f"{seconds(t):>{w}}" for t, w in zip((s.blocking_s, s.interval_s, s.detect_s, s.restart_s), (10, 8, 8, 8))
        )
        band = f"{s.simulated:.1%} ({s.simulated_low:.1%}-{s.simulated_high:.1%}){MARKS[s.method]}"
        verdict = f"{'meets' if s.meets_goal else 'misses'} {g.goal:.0%}"
        built = "" if s.built else "  (not built)"
        lines.append(f"  {s.name:<27} {times}  {band:<24} {s.closed_form:6.1%}  {verdict}{built}")
    lines += [f"  - {note}" for note in [*g.notes, *([g.needed] if g.needed else [])]]
    return [*lines, *([f"CANNOT FINISH: {g.cannot_finish}"] if g.cannot_finish else []), ""]


def peers_lines(p: PeersGoodput | None) -> list[str]:
    """Recovery from peers: each term with its figures and label, the recovery, the lost work, failure to first step
    beside the job path's, and the goodput with it (as configured, or a what-if); or the rules' refusal."""
    if p is None:
        return []
    if p.recovery is None or p.scenario is None:
        return [f"Recovery from peers (resilience.recovery=peers): refused by the rules: {p.refused}", ""]
    r, s = p.recovery, p.scenario
    how = "as configured" if p.configured else "a what-if (the campaign recovers as a job)"
    lines = [
        f"Recovery from peers at {r.world} ranks, {how}: {r.share:.0%} of failures (all but the hangs, which the "
        "heartbeat finds and the job path restarts)"
    ]
    width = max(len(t.how) for t in r.terms)
    lines += [f"  {t.name:<13} {seconds(t.seconds):>8}  {t.how:<{width}}  {t.label}" for t in r.terms]
    band = f"{s.simulated:.1%} ({s.simulated_low:.1%}-{s.simulated_high:.1%}){MARKS[s.method]}"
    lost = (
        f"half the snapshot interval on average, plus one more at the {p.snapshots.during_exchange:.2%} chance of "
        "striking during an exchange: every rank goes back to the newest snapshot complete (no replica)"
        if p.snapshots and p.snapshots.replicas < 2
        else "half a step on average: training resumes at the failed step"
    )
    lines += [
        f"  {'recovery':<13} {seconds(r.recover_s):>8}  the terms' sum: no checkpoint read, no queue",
        f"  {'lost work':<13} {seconds(r.lost_s):>8}  {lost}",
        f"  {'first step':<13} {seconds(r.first_step_s):>8}  failure to first step: the recovery and the failed step "
        f"({seconds(r.step_s)}); a hang's on the job path {seconds(p.job_first_step_s)} (D + R)",
        f"  {'goodput':<13} {band}, closed form {s.closed_form:.1%} ({s.name}{'' if s.built else '; not built'})",
        *(intervals(p) if p.configured else []),
        f"  - detection is the process-death case: a node lost without a TCP reset is seen only at the collective "
        f"timeout, {seconds(r.timeout_s)} (cluster.runtime.collective_timeout_s), not modelled",
    ]
    return [*lines, *(snapshot_lines(p.snapshots) if p.snapshots else []), ""]


def intervals(p: PeersGoodput) -> list[str]:
    """The two intervals under recovery from peers: the file-system checkpoint's (the hangs need it) and, where
    checkpoint.snapshot_steps > 0, the peer snapshots' (the other failures restore from them)."""
    s, n = p.scenario, p.snapshots
    lines = [f"  {'file system':<13} {seconds(s.interval_s):>8}  every {s.interval_steps} steps: {p.interval_how}"]
    if n:
        lines.append(
            f"  {'snapshots':<13} {seconds(n.interval_s):>8}  every {n.steps} steps (checkpoint.snapshot_steps)"
        )
    return lines


def snapshot_lines(n: SnapshotPlan) -> list[str]:
    """Peer snapshots: each term with its figures and label, the background part against the interval, the blocking
    share of the steps' time, the host memory they take at the peak beside its capacity (or the line refusing them),
    and which failures they recover."""
    width = max(len(t.how) for t in n.terms)
    lines = [
        f"  Peer snapshots every {n.steps} steps (checkpoint.snapshot_steps): the copy to host blocks the step, the "
        "exchange and CRC run in the background:"
    ]
    lines += [f"    {t.name:<11} {seconds(t.seconds):>8}  {t.how:<{width}}  {t.label}" for t in n.terms]
    covers = (
        f"every failure above: the layout holds {n.replicas} copy of each shard, so each restores from the snapshots"
        if n.replicas < 2
        else f"none in this model: a single failure leaves {n.replicas - 1} live replica(s) of each shard; one "
        "taking every replica of a shard at once would (not modelled)"
    )
    memory = (
        f"{n.host_bytes_per_node / GB:.4g} GB of host memory per node at the peak (each rank's state x 4 copies, 6 "
        "while an exchange runs)"
    )
    if n.other_bytes_per_node:
        memory += f" beside {n.other_bytes_per_node / GB:.4g} GB"
    return [
        *lines,
        f"    {'background':<11} {seconds(n.background_s):>8}  the exchange and CRC, "
        + (
            f"hidden in the {seconds(n.interval_s)} between snapshots"
            if not n.waits_s
            else f"longer than the {seconds(n.interval_s)} between snapshots: the next waits {seconds(n.waits_s)}"
        ),
        f"    {'blocking':<11} {seconds(n.blocking_s):>8}  the copy"
        + (" and the wait" if n.waits_s else "")
        + f", once every {n.steps} steps of {seconds(n.step_s)}: {n.share:.2%} of the steps' time",
        f"    - {memory}, of {n.host_capacity_bytes / GB:.4g} GB (cluster.allocation.mem_gb)",
        f"    - failures restored from the snapshots: {covers}",
        *([f"SNAPSHOTS REFUSED: {n.refused}"] if n.refused else []),
    ]


def checkpoint_rows(camp: CampaignPlan) -> list[tuple[str, str]]:
    """Young/Daly's interval and waste under both checkpoint modes, the configured one marked, and async's host
    memory."""
    a, mark = camp.asynchronous, {camp.mode: "  <- checkpoint.mode"}
    rows = [
        (
            "sync: Young/Daly",
            f"{camp.interval_s:.0f} s = {camp.interval_steps} steps (waste {camp.waste:.1%}){mark.get('sync', '')}",
        ),
        (
            "async: Young/Daly",
            f"{a.interval_s:.0f} s = {a.interval_steps} steps (waste {a.waste:.1%}): blocked {a.blocking_s:.3g} s "
            f"staging {size(a.staging_bytes).strip()}, durable {a.background_s:.3g} s later{mark.get('async', '')}",
        ),
        (
            "async: host memory",
            f"{size(a.host_bytes_per_node).strip()} of {size(a.host_capacity_bytes).strip()} per node",
        ),
    ]
    return rows + ([("async refused", a.refused)] if a.refused else [])


def remedy_lines(remedies: list[Remedy]) -> list[str]:
    if not remedies:
        return []
    lines = ["Remedies (one change each)"]
    for r in remedies:
        if r.refused is not None or r.step is None:
            lines.append(f"  {r.name:<34} refused: {r.refused}")
            continue
        s = r.step.split.shares()
        lines.append(
            f"  {r.name:<34} {r.step.tokens_per_s_per_device:9.1f} tokens/s/device  step {r.step.step_s:.3f} s  "
            f"tp {s['tp']:.0%} bubble {s['bubble']:.0%} act {s['activation']:.0%} dp {s['dp']:.0%}  "
            f"{size(r.memory_bytes or 0).strip()}{'' if r.fits else ' (does not fit)'}"
        )
    return [*lines, ""]


def seed_lines(seed: SeedComparison | None) -> list[str]:
    if seed is None:
        return []
    a, b = seed.seed, seed.plan
    lines = rows(
        "The seed's observation (4096 GH200) and the plan",
        [
            (
                "gradient all-reduce",
                f"seed {a['all_reduce']:.0%}  plan {b['all_reduce']:.1%} (with tp {b['all_reduce_with_tp']:.1%})",
            ),
            ("pipeline bubble", f"seed {a['bubble']:.0%}  plan {b['bubble']:.1%}"),
            ("activation traffic", f"seed {a['activation']:.0%}  plan {b['activation']:.1%}"),
            ("tokens/s/GPU", f"seed {a['tokens_per_s_per_device']:.0f}  plan {b['tokens_per_s_per_device']:.0f}"),
        ],
    )
    return lines + [f"  - {note}" for note in seed.notes]
