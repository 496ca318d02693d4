# One DAG node per segment; a local rule that submits the segment through submitit and waits
# (on Slurm the job may be requeued several times before the segment completes). Its params hold the checkpoint
# series' name (config.stages.SERIES), not the settings: a completed segment never reruns for a changed setting, and
# its inputs are ancient(), so a stage upstream that reruns (the gate after a layout change, staging after a new
# corpus) orders the next segments after it without making the completed ones stale.


rule train_segment:
    input:
        tokens=ancient(rules.stage_data.output.tokens),
        record=ancient(rules.stage_data.output.record),
        nccl=ancient(rules.validate_nccl.output.report),
        previous=previous_segment,
    output:
        report=TRAIN.segment_report("{segment}"),
        metrics=TRAIN.job_metrics("train_segment", segment="{segment}"),
    log:
        RUN.log("train_segment", "{series}/segment-{segment}"),
    wildcard_constraints:
        segment=r"\d+",
        series="|".join(SERIES),
    params:
        config_hash=lambda w: rule_hash("train_segment", PHASES[w.series]),
        phase=phase_of,
        io=lambda w, input, output: stage_command(
            staged_tokens=input.tokens,
            checkpoints=RunFolder.of(PHASES[w.series]).checkpoints,
            kernel_cache=RUN.kernel_cache,
            segment_report=output.report,
            job_metrics=output.metrics,
            submitit=RUN.submitit("train_segment"),
        ),
    shell:
        "{PYTHON} -m trainflow.stages.train_segment {HYDRA_ARGS} {params.phase} segment={wildcards.segment} {params.io} > {log:q} 2>&1"
