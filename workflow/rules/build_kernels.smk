# Before the gate: the fp8 kernels compiled once into the run's build cache (a no-op, saying so, without fp8, a GPU
# or a CUDA toolkit); ranks only load from it. On Slurm, profiles/ give it a node of the allocation's GPU type.
rule build_kernels:
    output:
        report=RUN.kernels_report,
        metrics=RUN.job_metrics("build_kernels"),
    log:
        RUN.log("build_kernels"),
    params:
        config_hash=rule_hash("build_kernels"),
        io=lambda w, output: stage_command(
            kernel_cache=RUN.kernel_cache, kernels_report=output.report, job_metrics=output.metrics
        ),
    resources:
        mem_mb=8000,
        runtime=30,
        cpus_per_task=8,
    shell:
        "{PYTHON} -m trainflow.stages.build_kernels {HYDRA_ARGS} {params.io} > {log:q} 2>&1"
