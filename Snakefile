# trainflow: one LLM training campaign as a DAG.
#   snakemake --profile profiles/local                         # this machine (the default)
#   snakemake --profile profiles/slurm --config run=r1 overrides="experiment=llama70b_alps"
# Snakemake owns the paths (rules pass every input/output as a Hydra override); Hydra owns the rest.

configfile: f"{workflow.basedir}/workflow/config.yaml"


report: "workflow/report/workflow.rst"  # snakemake --report run.html: the DAG, run times and the flagged outputs


include: "workflow/rules/common.smk"
include: "workflow/rules/prepare_data.smk"
include: "workflow/rules/stage_data.smk"
include: "workflow/rules/build_kernels.smk"
include: "workflow/rules/validate_nccl.smk"
include: "workflow/rules/train_segment.smk"
include: "workflow/rules/verify_checkpoint.smk"
include: "workflow/rules/evaluate.smk"
include: "workflow/rules/account_energy.smk"
include: "workflow/rules/report.smk"


# Distributed stages submit their own allocation through submitit and wait for it.
localrules:
    all,
    validate_nccl,
    train_segment,


# Every stage's output, not just the report: Snakemake does not rebuild a deleted intermediate
# file on its own, so deleting one output reruns that stage and what follows.
rule all:
    input:
        rules.prepare_data.output.tokens,
        rules.stage_data.output.tokens,
        rules.build_kernels.output.report,
        rules.validate_nccl.output.report,
        segment_reports,
        rules.verify_checkpoint.output.report,
        evaluations,
        rules.account_energy.output.report,
        rules.report.output.report,
