rule prepare_data:
    output:
        tokens=TOKENS,
        record=TOKENS_RECORD,
        metrics=RUN.stage_metrics("prepare_data"),
    log:
        RUN.log("prepare_data"),
    params:
        config_hash=stage_hash("prepare_data"),
        io=lambda w, output: stage_command(tokens=output.tokens, stage_metrics=output.metrics),
    resources:
        mem_mb=4000,
        runtime=60,
        cpus_per_task=1,
    shell:
        "{PYTHON} -m trainflow.stages.prepare_data {HYDRA_ARGS} {params.io} > {log:q} 2>&1"
