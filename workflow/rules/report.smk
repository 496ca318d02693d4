rule report:
    input:
        segments=SEGMENT_REPORTS,
        nccl=NCCL_REPORT,
        verify=VERIFY_REPORT,
        energy=ENERGY_REPORT,
        metrics=ALL_METRICS,
    output:
        # report(): also in Snakemake's self-contained HTML report (snakemake --report run.html)
        report=report(REPORT, category="Report", caption="../report/report.rst"),
        plots=[report(plot, category="Training") for plot in RUN.plots],
        metrics=RUN.stage_metrics("report"),
    log:
        RUN.log("report"),
    params:
        config_hash=rule_hash("report"),
        io=lambda w, input, output: stage_command(
            segment_reports=list(input.segments),
            nccl_report=input.nccl,
            verify_report=input.verify,
            energy_report=input.energy,
            metrics=list(input.metrics),
            checkpoints=CHECKPOINTS,
            report=output.report,
            plots=list(output.plots),
            stage_metrics=output.metrics,
        ),
    resources:
        mem_mb=1000,
        runtime=10,
        cpus_per_task=1,
    shell:
        "{PYTHON} -m trainflow.stages.report {HYDRA_ARGS} {params.io} > {log:q} 2>&1"
