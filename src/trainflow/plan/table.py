"""The plan as a readable table (what `python -m trainflow.plan` prints without --json).

python -m trainflow.plan experiment=llama70b_alps train.precision=bf16 train.activations=recompute
"""

from __future__ import annotations

GB = 1e9
PARTS = ("compute", "tp", "bubble", "activation", "dp", "optimizer")
LABELS = {
    "compute": "compute",
    "tp": "tp all-reduce in blocks",
    "bubble": "pipeline bubble",
    "activation": "activation send/recv",
    "dp": "dp gradient reduction (exposed)",
    "optimizer": "optimizer step",
}


def size(nbytes: float) -> str:
    """Bytes in GB, or MB below a GB (the tiny model's figures)."""
    return f"{nbytes / GB:9.2f} GB" if nbytes >= GB else f"{nbytes / 1e6:9.2f} MB"


def rows(title: str, pairs: list[tuple[str, str]]) -> list[str]:
    width = max(len(k) for k, _ in pairs)
    return [title, *(f"  {k:<{width}}  {v}" for k, v in pairs), ""]


def render(plan: dict) -> str:
    c, mem, step, ck, camp = plan["config"], plan["memory"], plan["step"], plan["checkpoint"], plan["campaign"]
    lines = [
        f"{c['model']} ({plan['parameters'] / 1e9:.2f} B parameters) on {c['devices']} devices, {c['layout']}, "
        f"{c['schedule'] or 'no pipeline'} v={c['virtual_stages']} m={c['microbatches']}, {c['dp_mode']}, "
        f"{c['precision']}, activations={c['activations']}, cluster {c['cluster']}",
        "",
    ]
    lines += rows(
        f"Memory per device (pipeline rank {mem['pp_rank']}, the fullest)",
        [
            ("weights (fp32)", size(mem["parameters"])),
            ("gradients (fp32)", size(mem["gradients"])),
            ("AdamW state (fp32)", size(mem["optimizer_state"])),
            ("bf16 weight copies", size(mem["weight_copies"])),
            ("activations in flight", size(mem["activations"])),
            ("FSDP gathered", size(mem["gathered"])),
            ("total / capacity", f"{size(mem['total'])} of {size(mem['capacity']).strip()}"),
        ],
    )
    if mem["overflow"]:
        lines += [f"OVERFLOW: {mem['overflow']}", ""]
    seconds, shares = step["seconds"], step["shares"]
    lines += rows(
        "Step (the slowest pipeline rank)",
        [(LABELS[k], f"{seconds[k]:10.4f} s  {shares[k]:6.1%}") for k in PARTS]
        + [
            ("step", f"{step['step_s']:10.4f} s"),
            ("tokens/s/device", f"{step['tokens_per_s_per_device']:10.1f}"),
            ("MFU", f"{step['mfu']:10.1%}"),
        ],
    )
    lines += rows(
        "Checkpoint and campaign",
        [
            ("checkpoint", f"{size(ck['bytes']).strip()}, written in {ck['save_s']:.3g} s"),
            (
                "Young/Daly interval",
                f"{ck['young_daly_s']:.0f} s = {ck['interval_steps']} steps (waste {ck['waste']:.1%})",
            ),
            ("campaign", f"{camp['steps']} steps, {camp['tokens']:.4g} tokens, {camp['hours']:.4g} h"),
            ("energy", f"{camp['facility_gwh']:.4g} GWh facility at {camp['watts_per_device']:g} W/device"),
            ("tokens per joule", f"{camp['tokens_per_joule']:.3g}"),
        ],
    )
    if plan.get("remedies"):
        lines.append("Remedies (one change each)")
        for r in plan["remedies"]:
            if "refused" in r:
                lines.append(f"  {r['remedy']:<34} refused: {r['refused']}")
                continue
            s = r["shares"]
            lines.append(
                f"  {r['remedy']:<34} {r['tokens_per_s_per_device']:9.1f} tokens/s/device  step {r['step_s']:.3f} s  "
                f"tp {s['tp']:.0%} bubble {s['bubble']:.0%} act {s['activation']:.0%} dp {s['dp']:.0%}  "
                f"{size(r['memory_gb'] * GB).strip()}{'' if r['fits'] else ' (does not fit)'}"
            )
        lines.append("")
    if seed := plan.get("seed"):
        a, b = seed["seed"], seed["plan"]
        lines += rows(
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
        lines += [f"  - {note}" for note in seed["notes"]]
    return "\n".join(lines).rstrip() + "\n"
