rule verify_checkpoint:
    input:
        segments=segment_reports,
    output:
        report=RUN.verify_report,
        metrics=RUN.job_metrics("verify_checkpoint"),
    log:
        RUN.log("verify_checkpoint"),
    params:
        config_hash=rule_hash("verify_checkpoint", LAST),
        phase=AFTER,
        io=lambda w, output: stage_command(
            checkpoints=RunFolder.of(LAST).checkpoints, verify_report=output.report, job_metrics=output.metrics
        ),
    resources:
        mem_mb=1000,
        runtime=60,
        cpus_per_task=1,
    shell:
        "{PYTHON} -m trainflow.stages.verify_checkpoint {HYDRA_ARGS} {params.phase} {params.io} > {log:q} 2>&1"
