"""Every command a ```bash block of README.md or docs/ shows, and what runs it (tests/workflow/test_docs.py holds the
pages and this table to each other: a command shown with no entry here, or an entry no page shows, fails).

A command is run by
- DRY_RUN: test_docs runs it as shown, with `-n`, in its tmp_path (a workflow command: the DAG is built, every config
  value checked, nothing trained);
- RUN: test_docs runs it as shown (a command of seconds);
- Ran(node, fragment): the test (or CI script) `node` runs it; `fragment`, the part of the command that names what
  runs, must be in that file, and a test node's function must exist. A `.venv/bin/python -m pytest` command must also
  name only paths that exist.
A line `a && b` is two commands.
"""

from __future__ import annotations

from typing import NamedTuple


class Ran(NamedTuple):
    node: str
    fragment: str


DRY_RUN = "dry run"
RUN = "run"

CI = Ran(".ci/run", "bash scripts/test.sh")
SUITE = Ran("scripts/test.sh", ".venv/bin/python -m pytest")  # the default suite: every test file not marked slow
LOCAL = "--profile profiles/local"
REAL_RUN = "tests/workflow/test_workflow.py::test_real_run_then_nothing_then_only_training_reruns"
MIXTURE_RUN = (  # slow
    "tests/workflow/test_workflow_config.py::"
    "test_a_mixture_runs_the_dag_reports_each_source_and_a_new_weight_applies_from_the_next_segment"
)
SLURM_RUN = "tests/slurm/test_workflow_on_slurm.py::test_failed_slurm_job_fails_its_rule_with_the_stage_error"
PLAN_JSON = "tests/unit/test_plan.py::test_the_command_prints_the_plan_as_json"
ESTIMATE = "tests/unit/test_energy_policy.py::test_the_estimate_command_prints_the_seeds_figures"
EXPORT_CLI = "tests/unit/test_export.py::test_a_corrupt_shard_fails_in_one_line_and_writes_nothing"
EXPORT = "tests/unit/test_export.py::test_exported_model_computes_trainflows_logits"
STATUS = "tests/unit/test_status.py::test_the_command_prints_lines_and_json_without_torch"
DRILL = "tests/integration/test_restarts.py::test_a_dead_rank_ends_the_job_fast_and_the_stage_restarts_it_bitwise"
GOODPUT_DRILL = (  # slow
    "tests/workflow/test_goodput_drill.py::test_measured_goodput_is_the_plan_from_the_runs_terms_at_both_mtbfs"
)
SLURM_DRILL = (  # slow, slurm, 3 nodes
    "tests/slurm/test_goodput_drill_on_slurm.py::"
    "test_measured_goodput_with_hot_restarts_on_slurm_is_the_plan_from_the_runs_terms"
)
FROM_RUN = "tests/unit/test_plan_from_run.py::test_from_run_prints_the_plan_beside_the_measurement"
HARDWARE_FROM = "tests/unit/test_measured_hardware.py::test_the_command_prints_the_values_as_overrides"
CAMPAIGN = (
    "tests/workflow/test_campaign.py::test_an_extended_campaign_trains_one_segment_and_a_variant_and_back_trains_none"
)
LAYOUT = "tests/distributed/test_steering.py::test_a_layout_change_at_a_segment_boundary_trains_on_like_the_old_layout"
BRANCH = (
    "tests/distributed/test_steering.py::"
    "test_a_branch_trains_a_new_series_from_a_checkpoint_and_leaves_the_old_one_as_it_was"
)
MTBF_DRILL = (
    "experiment=smoke train.segments=2 train.segment_steps=120 checkpoint.interval_steps=3 "
    "cluster.hardware.hang_share=0.4 resilience.hang_detect_s=20 resilience.heartbeat_s=0.5 "
    "resilience.max_restarts=40 fault.seed=2 fault.mtbf_s=30"
)

COMMANDS: dict[str, tuple[Ran | str, ...]] = {
    "bash scripts/bootstrap.sh": (Ran("scripts/test.sh", "bash scripts/bootstrap.sh"),),
    "bash scripts/test.sh": (CI,),
    f".venv/bin/snakemake {LOCAL}": (DRY_RUN, Ran(REAL_RUN, "profiles/local")),
    f'.venv/bin/snakemake {LOCAL} --config run=lr1e3 overrides="optim.lr=1e-3 parallel=dp2_tp2_pp2"': (DRY_RUN,),
    f'.venv/bin/snakemake {LOCAL} --config overrides="data=stdlib_mix"': (DRY_RUN, Ran(MIXTURE_RUN, "data=stdlib_mix")),
    f'.venv/bin/snakemake {LOCAL} --config run=shard overrides="parallel=dp2_shard_tp2"': (DRY_RUN,),
    f".venv/bin/snakemake {LOCAL} --forcerun verify_checkpoint": (DRY_RUN,),
    f'.venv/bin/snakemake {LOCAL} --config run=drill overrides="experiment=smoke fault.step=7 fault.rank=1 '
    'fault.signal=KILL"': (DRY_RUN, Ran(DRILL, '"fault.signal=KILL"')),
    f'.venv/bin/snakemake {LOCAL} --config run=mtbf overrides="{MTBF_DRILL}"': (
        DRY_RUN,
        Ran(GOODPUT_DRILL, "fault.mtbf_s="),
    ),
    ".venv/bin/python -m trainflow.plan --from-run runs/mtbf": (Ran(FROM_RUN, '"--from-run"'),),
    ".venv/bin/python -m trainflow.plan --hardware-from runs/mtbf experiment=smoke": (
        Ran(HARDWARE_FROM, '"--hardware-from"'),
    ),
    f'.venv/bin/snakemake {LOCAL} --config overrides="experiment=smoke train.segments=3"': (
        DRY_RUN,
        Ran(CAMPAIGN, "train.segments=3"),
    ),
    f'.venv/bin/snakemake {LOCAL} --config overrides="experiment=smoke train.segments=3 optim.lr=1e-3"': (
        DRY_RUN,
        Ran(CAMPAIGN, "train.segments=3 optim.lr=1e-3"),
    ),
    f'.venv/bin/snakemake {LOCAL} --config overrides="experiment=smoke train.segments=3 parallel=tp2"': (
        DRY_RUN,
        Ran(LAYOUT, '"tp2"'),
    ),
    f'.venv/bin/snakemake {LOCAL} --config overrides="experiment=smoke train.branch_from=6 optim.lr=1e-4"': (
        Ran(BRANCH, "train.branch_from="),
    ),
    "bash scripts/slurm_cluster.sh start --nodes 2": (Ran("scripts/test.sh", "slurm_cluster.sh start --nodes 2"),),
    "bash scripts/slurm_cluster.sh start --nodes 3": (Ran(SLURM_DRILL, "slurm_cluster.sh start --nodes 3"),),
    '.venv/bin/snakemake --profile profiles/slurm_local --config run=mtbf overrides="experiment=smoke '
    "train.segments=2 train.segment_steps=240 checkpoint.interval_steps=3 cluster.allocation.nodes=2 "
    "cluster.allocation.spare_nodes=1 cluster.hardware.hang_share=0.4 resilience.hang_detect_s=20 "
    'resilience.heartbeat_s=0.5 resilience.max_restarts=40 fault.seed=2 fault.mtbf_s=30"': (
        Ran(SLURM_DRILL, "profiles/slurm_local"),
    ),
    '.venv/bin/snakemake --profile profiles/slurm_local --config overrides="experiment=smoke"': (
        Ran(SLURM_RUN, "profiles/slurm_local"),
    ),
    ".venv/bin/python -m trainflow.plan experiment=llama70b_alps": (
        RUN,
        Ran(PLAN_JSON, '"trainflow.plan", "experiment=llama70b_alps"'),
    ),
    ".venv/bin/python -m trainflow.plan experiment=llama70b_alps train.fp8=delayed": (RUN,),
    ".venv/bin/python -m trainflow.plan experiment=llama70b_alps_campaign": (RUN,),
    ".venv/bin/python -m trainflow.status runs/default": (Ran(STATUS, "from trainflow.status.__main__ import main"),),
    ".venv/bin/python -m trainflow.energy.estimate": (RUN, Ran(ESTIMATE, "main([])")),
    ".venv/bin/python -m trainflow.export CHECKPOINT OUT": (
        Ran(EXPORT_CLI, '"trainflow.export"'),
        Ran(EXPORT, "export(Path(cfg.io.checkpoints)"),
    ),
    ".venv/bin/python -m pytest tests/unit/test_overrides.py tests/unit/test_checkpoint_attacks.py": (SUITE,),
    ".venv/bin/python -m pytest tests/unit/test_layers.py tests/unit/test_stage_table.py": (SUITE,),
    ".venv/bin/python -m pytest tests/unit": (SUITE,),
}
