"""The run's paths: its storage tiers, and the io paths Snakemake passes each stage (config.run_folder fills the rest).

python -c "from trainflow.config import compose; print(compose('report').io)"
"""

from __future__ import annotations

from dataclasses import dataclass, field

from omegaconf import MISSING


@dataclass
class StorageConfig:
    root: str = MISSING
    capacity: str = MISSING
    """High-capacity tier (HDD / parallel FS): raw tokens, checkpoints."""
    fast: str = MISSING
    """Fast tier (node SSD / flash): the staged dataset."""


@dataclass
class IOConfig:
    """Paths. Snakemake passes every one it owns as an override; one left empty is filled in from the
    run folder's layout (config.run_folder), so a stage run alone writes where the workflow would."""

    tokens: str = ""
    """The index of the token shards on the capacity tier (prepare_data's main job writes it)."""
    tokenizer: str = ""
    """The BPE prepare_data's tokenizer job trains (data.tokenizer=bpe) and its shard jobs read."""
    token_shard: str = ""
    """The shard prepare_data's job shard-NNNNN writes."""
    staged_tokens: str = ""
    nccl_report: str = ""
    checkpoints: str = ""
    resume_from: str = ""
    """Another run's checkpoint folder to start from when `checkpoints` holds none; DCP reshards it,
    so the layout may differ (e.g. dp2 x tp2 x pp2 -> dp4 x tp2). Empty: none."""
    init_from: str = ""
    """A Hugging Face LlamaForCausalLM folder (config.json, safetensors) whose weights a run starts from at step 0 when
    neither `checkpoints` nor resume_from holds a checkpoint; resharded to the layout, the optimizer fresh. config.json
    must describe the configured model (trainflow.hf.llama). Empty: random initialisation."""
    segment_report: str = ""
    segment_reports: list[str] = field(default_factory=list)
    verify_report: str = ""
    corpus_task: str = ""
    """The corpus task the evaluate stage builds from the series' corpus (evaluate.corpus_task) and scores."""
    evaluation: str = ""
    """The evaluate stage's record of one checkpoint (trainflow.evaluate.records.EvalRecord)."""
    evaluations: list[str] = field(default_factory=list)
    """Every evaluation record the report reads: the evaluated segments' of every phase."""
    energy_report: str = ""
    job_metrics: str = ""
    """This job's own metrics file (trainflow.energy.metrics.JobMetrics; trainflow.stage.run_stage writes it)."""
    run_metrics: list[str] = field(default_factory=list)
    """Every earlier job's metrics file, which account_energy and report read."""
    report: str = ""
    plots: list[str] = field(default_factory=list)
    """The report's plots (config.run_folder.PLOTS), in that order."""
    submitit: str = ""
    kernel_cache: str = ""
    """The fp8 kernels' build cache on the shared tier (trainflow.fp8.cache): build_kernels compiles into it once,
    ranks only load from it."""
    kernels_report: str = ""
    """build_kernels' record of what it built or found, or why nothing (trainflow.fp8.build.KernelsReport)."""
