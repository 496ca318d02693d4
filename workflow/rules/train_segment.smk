# One DAG node per segment; a local rule that submits the segment through submitit and waits
# (on Slurm the job may be requeued several times before the segment completes).


rule train_segment:
    input:
        tokens=STAGED_TOKENS,
        nccl=NCCL_REPORT,
        previous=previous_segment,
    output:
        report=f"{TRAIN_DIR}/segment-{{segment}}.json",
        metrics=f"{TRAIN_DIR}/metrics-{{segment}}.json",
    log:
        f"{ROOT}/logs/train_segment/segment-{{segment}}.log",
    wildcard_constraints:
        segment=r"\d+",
    params:
        config_hash=stage_hash("train_segment"),
        io=lambda w, input, output: stage_command(
            "train_segment",
            staged_tokens=input.tokens,
            checkpoints=CHECKPOINTS,
            segment_report=output.report,
            stage_metrics=output.metrics,
            submitit=f"{ROOT}/submitit/train_segment",
        ),
    shell:
        "{PYTHON} -m trainflow.stages.train_segment {HYDRA_ARGS} segment={wildcards.segment} {params.io} > {log:q} 2>&1"
