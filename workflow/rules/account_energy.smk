rule account_energy:
    input:
        metrics=run_metrics,
        segments=segment_reports,
    output:
        report=RUN.energy_report,
        metrics=RUN.job_metrics("account_energy"),
    log:
        RUN.log("account_energy"),
    params:
        config_hash=rule_hash("account_energy", LAST),
        phase=AFTER,
        io=lambda w, input, output: stage_command(
            run_metrics=list(input.metrics),
            segment_reports=list(input.segments),
            energy_report=output.report,
            job_metrics=output.metrics,
        ),
    resources:
        mem_mb=1000,
        runtime=10,
        cpus_per_task=1,
    shell:
        "{PYTHON} -m trainflow.stages.account_energy {HYDRA_ARGS} {params.phase} {params.io} > {log:q} 2>&1"
