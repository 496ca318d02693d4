# A local rule: it plans the run, then submits a job of the training shape through submitit and waits.
rule validate_nccl:
    input:
        kernels=rules.build_kernels.output.report,  # built once before any job of the training shape
    output:
        report=RUN.nccl_report,
        metrics=RUN.job_metrics("validate_nccl"),
    log:
        RUN.log("validate_nccl"),
    params:
        config_hash=rule_hash("validate_nccl"),
        io=lambda w, output: stage_command(
            nccl_report=output.report,
            checkpoints=RUN.checkpoints,
            job_metrics=output.metrics,
            submitit=RUN.submitit("validate_nccl"),
        ),
    shell:
        "{PYTHON} -m trainflow.stages.validate_nccl {HYDRA_ARGS} {params.io} > {log:q} 2>&1"
