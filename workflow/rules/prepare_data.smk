# The corpus is cut into data.shards groups of files (trainflow.data.corpus); each group is tokenised by its own job
# (on Slurm, one plugin job each), with the one tokenizer every shard shares (a BPE is trained once, before them), and
# a last job gathers the shards into the index training and staging read. `job=` tells the stage which job it is.


rule prepare_data_tokenizer:
    input:
        corpus=[f for files in SHARD_FILES for f in files],
    output:
        tokenizer=RUN.tokenizer,
        metrics=RUN.job_metrics("prepare_data", "tokenizer"),
    log:
        RUN.log("prepare_data", "tokenizer"),
    params:
        config_hash=rule_hash("prepare_data"),
        io=lambda w, output: stage_command(tokenizer=output.tokenizer, job_metrics=output.metrics),
    resources:
        mem_mb=4000,
        runtime=60,
        cpus_per_task=1,
    shell:
        "{PYTHON} -m trainflow.stages.prepare_data {HYDRA_ARGS} job=tokenizer {params.io} > {log:q} 2>&1"


rule prepare_data_shard:
    input:
        files=shard_files,
        tokenizer=shard_tokenizer,
    output:
        shard=RUN.token_shard("{shard}"),
        record=recorded(RUN.token_shard("{shard}")),
        metrics=RUN.job_metrics("prepare_data", "shard-{shard}"),
    log:
        RUN.log("prepare_data", "shard-{shard}"),
    wildcard_constraints:
        shard=r"\d{5}",
    params:
        config_hash=rule_hash("prepare_data"),
        io=lambda w, input, output: stage_command(
            token_shard=output.shard, tokenizer=RUN.tokenizer, job_metrics=output.metrics
        ),
    resources:
        mem_mb=4000,
        runtime=60,
        cpus_per_task=1,
    shell:
        "{PYTHON} -m trainflow.stages.prepare_data {HYDRA_ARGS} job=shard-{wildcards.shard} {params.io} > {log:q} 2>&1"


rule prepare_data:
    input:
        shards=expand(rules.prepare_data_shard.output.shard, shard=SHARDS),
        records=expand(rules.prepare_data_shard.output.record, shard=SHARDS),
    output:
        tokens=RUN.tokens,
        record=recorded(RUN.tokens),
        metrics=RUN.job_metrics("prepare_data"),
    log:
        RUN.log("prepare_data"),
    params:
        config_hash=rule_hash("prepare_data"),
        io=lambda w, output: stage_command(tokens=output.tokens, job_metrics=output.metrics),
    resources:
        mem_mb=1000,
        runtime=10,
        cpus_per_task=1,
    shell:
        "{PYTHON} -m trainflow.stages.prepare_data {HYDRA_ARGS} {params.io} > {log:q} 2>&1"
