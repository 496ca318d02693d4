rule report:
    input:
        segments=[segment_report(i) for i in SEGMENTS],
        nccl=NCCL_REPORT,
        verify=VERIFY_REPORT,
        energy=ENERGY_REPORT,
        metrics=ALL_METRICS,
    output:
        report=REPORT,
        plots=[f"{REPORT.rsplit('/', 1)[0]}/{name}.png" for name in ("loss", "throughput", "breakdown")],
    log:
        log_file("report"),
    params:
        config_hash=stage_hash("report"),
        io=lambda w, input, output: stage_command(
            "report",
            segment_reports=list(input.segments),
            nccl_report=input.nccl,
            verify_report=input.verify,
            energy_report=input.energy,
            metrics=list(input.metrics),
            checkpoints=CHECKPOINTS,
            report=output.report,
            stage_metrics=f"{ROOT}/metrics/report.json",
        ),
    resources:
        mem_mb=1000,
        runtime=10,
        cpus_per_task=1,
    shell:
        "{PYTHON} -m trainflow.stages.report {HYDRA_ARGS} {params.io} > {log:q} 2>&1"
