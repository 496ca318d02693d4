# The staged shards are not declared outputs: Snakemake deletes a job's outputs before it runs, and
# stage_data keeps every shard already staged and identical (a rerun after a kill resumes). The staged
# index, written last, stands for them.


rule stage_data:
    input:
        tokens=rules.prepare_data.output.tokens,
        record=rules.prepare_data.output.record,
    output:
        tokens=RUN.staged_tokens,
        record=recorded(RUN.staged_tokens),
        metrics=RUN.job_metrics("stage_data"),
    log:
        RUN.log("stage_data"),
    params:
        config_hash=rule_hash("stage_data"),
        io=lambda w, input, output: stage_command(
            tokens=input.tokens, staged_tokens=output.tokens, job_metrics=output.metrics
        ),
    resources:
        mem_mb=1000,
        runtime=30,
        cpus_per_task=1,
    shell:
        "{PYTHON} -m trainflow.stages.stage_data {HYDRA_ARGS} {params.io} > {log:q} 2>&1"
