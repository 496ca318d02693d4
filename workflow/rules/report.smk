rule report:
    input:
        segments=segment_reports,
        nccl=rules.validate_nccl.output.report,
        verify=rules.verify_checkpoint.output.report,
        energy=rules.account_energy.output.report,
        evaluations=evaluations,
        metrics=run_metrics,
    output:
        # report(): also in Snakemake's self-contained HTML report (snakemake --report run.html)
        report=report(RUN.report, category="Report", caption="../report/report.rst"),
        plots=[report(plot, category="Training") for plot in RUN.plots],
        metrics=RUN.job_metrics("report"),
    log:
        RUN.log("report"),
    params:
        config_hash=rule_hash("report", LAST),
        phase=AFTER,
        io=lambda w, input, output: stage_command(
            segment_reports=list(input.segments),
            nccl_report=input.nccl,
            verify_report=input.verify,
            energy_report=input.energy,
            evaluations=list(input.evaluations),
            run_metrics=list(input.metrics),
            checkpoints=RunFolder.of(LAST).checkpoints,
            report=output.report,
            plots=list(output.plots),
            job_metrics=output.metrics,
        ),
    resources:
        mem_mb=1000,
        runtime=10,
        cpus_per_task=1,
    shell:
        "{PYTHON} -m trainflow.stages.report {HYDRA_ARGS} {params.phase} {params.io} > {log:q} 2>&1"
