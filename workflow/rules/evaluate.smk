# One job per evaluated segment of each phase (evaluate.every; each phase's last always): it scores the segment's last
# checkpoint on the downstream tasks. Its input is the segment's summary, ancient, so it starts as soon as the segment
# lands and runs beside the next segment, which never waits for it. ancient() keeps a newer summary or token index from
# making it stale, but a rerun of its segment (which restores its outputs) evaluates again: Snakemake reruns a job whose
# input another job of the same run writes. Its params hash the series and evaluate.*: new tasks rerun them all.
from trainflow.preflight import load_bytes


rule evaluate:
    input:
        segment=ancient(TRAIN.segment_report("{segment}")),
        tokens=ancient(rules.prepare_data.output.tokens),
    output:
        record=TRAIN.evaluation("{segment}"),
        metrics=TRAIN.job_metrics("evaluate", segment="{segment}"),
    log:
        RUN.log("evaluate", "{series}/segment-{segment}"),
    wildcard_constraints:
        segment=r"\d+",
        series="|".join(SERIES),
    params:
        config_hash=lambda w: rule_hash("evaluate", PHASES[w.series]),
        phase=phase_of,
        io=lambda w, input, output: stage_command(
            segment_report=input.segment,
            tokens=input.tokens,
            checkpoints=RunFolder.of(PHASES[w.series]).checkpoints,
            corpus_task=RunFolder.of(PHASES[w.series]).corpus_task,
            evaluation=output.record,
            job_metrics=output.metrics,
        ),
    resources:
        mem_mb=lambda w: 2000 + load_bytes(PHASES[w.series].model) // 10**6,  # fp32 weights twice while they load
        runtime=60,
        cpus_per_task=1,
    shell:
        "{PYTHON} -m trainflow.stages.evaluate {HYDRA_ARGS} {params.phase} segment={wildcards.segment} {params.io} > {log:q} 2>&1"
