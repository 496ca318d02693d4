rule verify_checkpoint:
    input:
        segments=[segment_report(i) for i in SEGMENTS],
    output:
        report=VERIFY_REPORT,
        metrics=metrics("verify_checkpoint"),
    log:
        log_file("verify_checkpoint"),
    params:
        config_hash=TRAIN_HASH,
        io=lambda w, output: stage_command(
            "verify_checkpoint", checkpoints=CHECKPOINTS, verify_report=output.report, stage_metrics=output.metrics
        ),
    resources:
        mem_mb=1000,
        runtime=60,
        cpus_per_task=1,
    shell:
        "{PYTHON} -m trainflow.stages.verify_checkpoint {HYDRA_ARGS} {params.io} > {log:q} 2>&1"
