# Shared by every rule: validate the Snakemake config, compose the Hydra config once (to learn the DAG's shape and
# the outputs' paths), and build each stage's command line. Rules take their outputs' paths from RUN
# (trainflow.config.run_folder) and their inputs from the rules that produce them (rules.<producer>.output.<name>).
import dataclasses
import shlex
import sys

from snakemake.exceptions import WorkflowError
from snakemake.logging import logger
from snakemake.utils import validate

from trainflow.campaign.check import check_campaign
from trainflow.config import ConfigError, stage_hash
from trainflow.config.run_folder import RunFolder
from trainflow.data.corpus import shard_plan
from trainflow.data.record import DataError, record_path
from trainflow.config.overrides import check_workflow_config, compose_phases, compose_workflow, hydra_quote
from trainflow.config.phases import phase_arg
from trainflow.config.rules import spike_warning
from trainflow.evaluate.harness_index import harness_name_errors
from trainflow.preflight import evaluation_errors, preflight
from trainflow.records import RecordError
from trainflow.train.adopt import check_legacy

try:
    config.update(check_workflow_config(config))  # as text, in one line, before the schema below would dump itself
    CFG, OVERRIDES = compose_workflow(config["run"], config["site"], config["overrides"])
    PHASES = compose_phases(CFG, OVERRIDES)  # each phase's config by its series (config.phases); one without phases
    preflight(CFG)  # the files and tools it names (io.init_from, a tokenizer), before any stage runs
    # the evaluate jobs' model in one process; lm-eval's task names (~6 s, only where evaluate.tasks has one)
    if errors := evaluation_errors(CFG) or harness_name_errors(CFG):
        raise ConfigError("config cannot run here: " + "; ".join(errors))
    check_campaign(CFG)  # the same model as the campaign in the run folder, its series' seed, a branch's checkpoint
    check_legacy(CFG)  # series of a trainflow before campaign records: the config's is adopted, or refused
except (ConfigError, RecordError) as err:
    raise WorkflowError(str(err)) from None
validate(config, "../schemas/config.schema.yaml")
if warning := spike_warning(CFG):
    logger.warning(warning)

# Every rule's shell line reads these two globals (snakemake --lint notes it): putting the overrides
# in params would make any change of any setting rerun every stage, since params decide reruns.
# The params hold the hash of what each stage reads instead.
PYTHON = shlex.quote(sys.executable)
HYDRA_ARGS = shlex.join(OVERRIDES)
RUN = RunFolder.of(CFG)
TRAIN = dataclasses.replace(RUN, series="{series}")  # a training segment's paths, its phase's series a wildcard
SERIES = list(PHASES)  # in the phases' order
LAST = PHASES[SERIES[-1]]  # the last phase's config: what the stages after training read
AFTER = phase_arg(LAST)  # their phase= override (params.phase)
try:  # every source's groups of input files (data.sources; a plain data.corpus is one), numbered across them
    SHARD_FILES = [files for _, files in shard_plan(CFG.data)]
except DataError as err:
    raise WorkflowError(str(err)) from None
SHARDS = [f"{i:05d}" for i in range(len(SHARD_FILES))]  # prepare_data's jobs: one per group of input files
BPE = CFG.data.tokenizer == "bpe"  # a BPE is trained once, by a job of its own, before the shards


def recorded(path):
    """The size and CRC-32C record beside a token file (trainflow.data.record)."""
    return str(record_path(path))


def shard_files(wildcards):
    """A shard's input files: a change in them (or in which they are) reruns that shard alone."""
    return SHARD_FILES[int(wildcards.shard)]


def shard_tokenizer(wildcards):
    """What a shard job tokenises with, besides the bytes tokenizer that needs no file."""
    if BPE:
        return rules.prepare_data_tokenizer.output.tokenizer
    return [CFG.data.tokenizer_path] if CFG.data.tokenizer == "pretrained" else []


def previous_segment(wildcards):
    """Segment i starts from segment i-1's last checkpoint, a later phase's segment 0 from its parent phase's last
    segment. Ancient: a rerun of a completed segment (which restores its outputs, trainflow.train.kept) does not make
    the ones after it stale."""
    segment, at = int(wildcards.segment), SERIES.index(wildcards.series)
    if segment > 0:
        return ancient(TRAIN.segment_report(segment - 1).format(series=wildcards.series))
    if at > 0:
        parent = SERIES[at - 1]
        return ancient(TRAIN.segment_report(PHASES[parent].train.segments - 1).format(series=parent))
    return []


def phase_segments():
    """Every phase's (series, segment), in order."""
    return [(series, i) for series, cfg in PHASES.items() for i in range(cfg.train.segments)]


def segment_reports(wildcards):
    return [TRAIN.segment_report(i).format(series=series) for series, i in phase_segments()]


def evaluations(wildcards):
    """The evaluation records of every phase's evaluated segments (evaluate.every; each phase's last always), none of
    a phase whose evaluate.enabled is false."""
    return [
        TRAIN.evaluation(i).format(series=series)
        for series, cfg in PHASES.items()
        if cfg.evaluate.enabled
        for i in cfg.evaluate.segments(cfg.train.segments)
    ]


def segment_metrics(wildcards):
    return [TRAIN.job_metrics("train_segment", segment=i).format(series=series) for series, i in phase_segments()]


def phase_of(wildcards):
    """The phase= override of a training segment's series."""
    return phase_arg(PHASES[wildcards.series])


def run_metrics(wildcards):
    """Every job's metrics before account_energy (and report): all of them are counted."""
    return [
        *([rules.prepare_data_tokenizer.output.metrics] if BPE else []),
        *expand(rules.prepare_data_shard.output.metrics, shard=SHARDS),
        rules.prepare_data.output.metrics,
        rules.stage_data.output.metrics,
        rules.build_kernels.output.metrics,
        rules.validate_nccl.output.metrics,
        *segment_metrics(wildcards),
        rules.verify_checkpoint.output.metrics,
    ]


def rule_hash(stage, cfg=None):
    """The rule's params: the hash of what the stage reads (trainflow.config.stages) in `cfg` (the first phase's
    unless given), so a change there reruns it and what follows."""
    return stage_hash(cfg or CFG, stage)


def stage_command(**io):
    """The io.<name>=<path> overrides of a stage, quoted for Hydra (paths may hold spaces, commas,
    brackets) and then for the shell. Rules run `{PYTHON} -m trainflow.stages.<stage> {HYDRA_ARGS}
    {params.io} > {log:q}`: the overrides stay out of params, whose values decide reruns, so only the
    config hash there does."""
    return shlex.join(f"io.{k}={hydra_quote(v)}" for k, v in io.items())
