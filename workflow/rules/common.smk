# Shared by every rule: validate the Snakemake config, compose the Hydra config once (to learn the
# DAG's shape and paths), and build each stage's command line.
import shlex
import sys

from snakemake.exceptions import WorkflowError
from snakemake.utils import validate

from trainflow.config import ConfigError, stage_hash
from trainflow.config.run_folder import RunFolder
from trainflow.data.corpus import corpus_files, shard_groups
from trainflow.data.record import DataError, record_path
from trainflow.config.overrides import compose_workflow, hydra_quote

validate(config, "../schemas/config.schema.yaml")

try:
    CFG, OVERRIDES = compose_workflow(config["run"], config["site"], config["overrides"])
except ConfigError as err:
    raise WorkflowError(str(err)) from None

# Every rule's shell line reads these two globals (snakemake --lint notes it): putting the overrides
# in params would make any change of any setting rerun every stage, since params decide reruns.
# The params hold the hash of what each stage reads instead.
PYTHON = shlex.quote(sys.executable)
HYDRA_ARGS = shlex.join(OVERRIDES)
RUN = RunFolder.of(CFG)  # every path below: trainflow.config.run_folder
SEGMENTS = range(CFG.train.segments)
CHECKPOINTS = RUN.checkpoints
TOKENS = RUN.tokens
TOKENS_RECORD = str(record_path(TOKENS))  # size and CRC-32C of the token file (trainflow.data.record)
SHARDS = [f"{i:05d}" for i in range(CFG.data.shards)]  # prepare_data's jobs: one per group of input files
try:
    SHARD_FILES = shard_groups(corpus_files(CFG.data.corpus), CFG.data.shards)
except DataError as err:
    raise WorkflowError(str(err)) from None
SHARD_TOKENIZER = {"byte": [], "bpe": [RUN.tokenizer], "pretrained": [CFG.data.tokenizer_path]}[CFG.data.tokenizer]
STAGED_TOKENS = RUN.staged_tokens
STAGED_RECORD = str(record_path(STAGED_TOKENS))
NCCL_REPORT = RUN.nccl_report
VERIFY_REPORT = RUN.verify_report
ENERGY_REPORT = RUN.energy_report
REPORT = RUN.report
SEGMENT_REPORTS = RUN.segment_reports(CFG.train.segments)
PREPARE_JOBS = ["tokenizer"] * (CFG.data.tokenizer == "bpe") + [f"shard-{shard}" for shard in SHARDS]
ALL_METRICS = RUN.metrics(CFG.train.segments, PREPARE_JOBS)  # every job's energy is counted


def previous_segment(wildcards):
    """Segment i starts from segment i-1's last checkpoint."""
    segment = int(wildcards.segment)
    return [RUN.segment_report(segment - 1)] if segment > 0 else []


def shard_files(wildcards):
    """A shard's input files: a change in them (or in which they are) reruns that shard alone."""
    return SHARD_FILES[int(wildcards.shard)]


def rule_hash(stage):
    """The rule's params: the hash of what the stage reads (trainflow.config.stages), so a change there reruns it
    and what follows."""
    return stage_hash(CFG, stage)


def stage_command(**io):
    """The io.<name>=<path> overrides of a stage, quoted for Hydra (paths may hold spaces, commas,
    brackets) and then for the shell. Rules run `{PYTHON} -m trainflow.stages.<stage> {HYDRA_ARGS}
    {params.io} > {log:q}`: the overrides stay out of params, whose values decide reruns, so only the
    config hash there does."""
    return shlex.join(f"io.{k}={hydra_quote(v)}" for k, v in io.items())
