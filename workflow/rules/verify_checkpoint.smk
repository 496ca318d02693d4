rule verify_checkpoint:
    input:
        segments=SEGMENT_REPORTS,
    output:
        report=VERIFY_REPORT,
        metrics=RUN.stage_metrics("verify_checkpoint"),
    log:
        RUN.log("verify_checkpoint"),
    params:
        config_hash=rule_hash("verify_checkpoint"),
        io=lambda w, output: stage_command(
            checkpoints=CHECKPOINTS, verify_report=output.report, stage_metrics=output.metrics
        ),
    resources:
        mem_mb=1000,
        runtime=60,
        cpus_per_task=1,
    shell:
        "{PYTHON} -m trainflow.stages.verify_checkpoint {HYDRA_ARGS} {params.io} > {log:q} 2>&1"
