rule account_energy:
    input:
        metrics=ALL_METRICS,
        segments=[segment_report(i) for i in SEGMENTS],
    output:
        report=ENERGY_REPORT,
    log:
        log_file("account_energy"),
    params:
        config_hash=stage_hash("account_energy"),
        io=lambda w, input, output: stage_command(
            "account_energy",
            metrics=list(input.metrics),
            segment_reports=list(input.segments),
            energy_report=output.report,
            stage_metrics=f"{ROOT}/metrics/account_energy.json",
        ),
    resources:
        mem_mb=1000,
        runtime=10,
        cpus_per_task=1,
    shell:
        "{PYTHON} -m trainflow.stages.account_energy {HYDRA_ARGS} {params.io} > {log:q} 2>&1"
