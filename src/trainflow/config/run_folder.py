"""The run folder's layout: every path a run writes, as a function of the storage roots and the checkpoint series the
config trains (config.identity.series_name: the campaign's identity, and the branch). The workflow's rules (common.smk)
take their outputs from here, and so does every `io.*` path a
stage is not given, so a stage run alone writes exactly where the workflow would; a path no rule declares (power
traces, TensorBoard, the exclude list) is a member here too, so nothing else invents a location.

    python -c "from trainflow.config import compose; from trainflow.config.run_folder import RunFolder; \
        print(RunFolder.of(compose('report')))"

    <root>/campaign.json                                   train_segment (what the campaign is: trainflow.campaign)
    <root>/nccl.json, nccl-exclude.txt (a failed gate)      validate_nccl
    <root>/verify.json, energy.json                        verify_checkpoint, account_energy
    <root>/train/<series>/segment-<i>.json, metrics-<i>.json  train_segment (its summary, its job's metrics)
    <root>/train/<series>/tensorboard/, profile/segment-<i>/, power/   train_segment (observe.*, energy sampling)
    <root>/train/<series>/run.json, wandb/; <root>/mlflow.db, mlflow-artifacts/   train_segment (observe.*)
    <root>/evaluate/<series>/segment-<i>.json, corpus-task.jsonl   evaluate (one checkpoint's scores; the corpus task)
    <root>/report/report.md, <plot>.png                    report
    <root>/metrics/<stage>.json, metrics/<stage>/<job>.json, logs/<stage>/, submitit/<stage>/   every stage
    <root>/metrics/evaluate/<series>/segment-<i>.json      evaluate (each job's)
    <capacity>/data/tokens/index.json, shard-NNNNN.h5 (+ .crc.json), tokenizer.json (bpe)   prepare_data
    <capacity>/checkpoints/<series>/step-N/, steps.jsonl, evals.jsonl, jobs.jsonl, hosts.jsonl   train_segment
    <capacity>/checkpoints/<series>/series.json, lineage.jsonl, changes.jsonl, segments/, live-<i>.json   train_segment
    <fast>/data/tokens/index.json, shard-NNNNN.h5 (+ .crc.json)                      stage_data
    <train.offload_dir>/rank<r>/                           train_segment's offloaded activations (train.activations)
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from trainflow.config.identity import series_name
from trainflow.config.schema import TrainflowConfig

SEGMENT_FILE = re.compile(r"segment-([0-9]{1,9})\.json")
PLOTS = ("loss", "throughput", "breakdown", "power", "goodput", "evaluations")
EVERY_SEGMENT = ("account_energy", "report")
"""The stages that read every segment's summary and metrics (io.segment_reports, io.run_metrics): only their configs
list them, so composing any other stage (the DAG's plan is train_segment's) costs nothing per segment."""
TOKEN_INDEX = "index.json"
TOKENIZER = "tokenizer.json"


def shard_name(shard: int | str) -> str:
    """A token shard's file name: shard-00003.h5 (a string, such as a Snakemake wildcard, is taken as is)."""
    return f"shard-{shard:05d}.h5" if isinstance(shard, int) else f"shard-{shard}.h5"


@dataclass(frozen=True)
class RunFolder:
    root: str
    capacity: str
    fast: str
    series: str
    """Training outputs live under the checkpoint series' name (config.identity): a changed setting continues the
    series; another model (an identity change, refused inside a run: trainflow.campaign) or a branch is another."""

    @classmethod
    def of(cls, cfg: TrainflowConfig) -> RunFolder:
        s = cfg.storage
        return cls(s.root, s.capacity, s.fast, series_name(cfg))

    # -- data ------------------------------------------------------------------------------------

    @property
    def tokens(self) -> str:
        """The index of the token shards, which lie beside it (data.index)."""
        return f"{self.capacity}/data/tokens/{TOKEN_INDEX}"

    def token_shard(self, shard: int | str) -> str:
        return f"{self.capacity}/data/tokens/{shard_name(shard)}"

    @property
    def tokenizer(self) -> str:
        """The BPE trained once before the shards (data.tokenizer=bpe)."""
        return f"{self.capacity}/data/tokens/{TOKENIZER}"

    @property
    def staged_tokens(self) -> str:
        return f"{self.fast}/data/tokens/{TOKEN_INDEX}"

    # -- the gate and training ---------------------------------------------------------------------

    @property
    def campaign_record(self) -> str:
        """What the campaign is (trainflow.campaign.CampaignRecord): its identity, checked before every segment."""
        return f"{self.root}/campaign.json"

    @property
    def nccl_report(self) -> str:
        return f"{self.root}/nccl.json"

    @property
    def nccl_exclude(self) -> str:
        """The hosts of the patterns that failed the gate, in sbatch --exclude form (written only then)."""
        return f"{self.root}/nccl-exclude.txt"

    @property
    def checkpoints(self) -> str:
        return f"{self.capacity}/checkpoints/{self.series}"

    def series_checkpoints(self, series: str) -> str:
        """Another series' checkpoint folder in this run (a branch's parent)."""
        return f"{self.capacity}/checkpoints/{series}"

    @staticmethod
    def series_record(checkpoints: str) -> str:
        """The series' seed and parent (trainflow.campaign.SeriesRecord), written when its first segment starts."""
        return f"{checkpoints}/series.json"

    @staticmethod
    def lineage_log(checkpoints: str) -> str:
        """One line per completed segment (trainflow.campaign.Lineage): its steps, what it continued from, its
        settings' changes and its code. A segment is complete once its line is there."""
        return f"{checkpoints}/lineage.jsonl"

    @staticmethod
    def changes_log(checkpoints: str) -> str:
        """Every setting a job changed against the checkpoint it resumed from, at that step (config.identity.Change)."""
        return f"{checkpoints}/changes.jsonl"

    @staticmethod
    def kept_summary(checkpoints: str, segment: int) -> str:
        """A completed segment's summary, kept beside its checkpoints: a rerun restores the workflow's output from it
        (Snakemake deletes a job's outputs before running it again)."""
        return f"{checkpoints}/segments/segment-{segment}.json"

    @staticmethod
    def kept_metrics(checkpoints: str, segment: int) -> str:
        """A completed segment's job metrics, kept as its summary is."""
        return f"{checkpoints}/segments/metrics-{segment}.json"

    @staticmethod
    def live_job(checkpoints: str, segment: int) -> str:
        """The job training the segment now and the stage that waits for it (launch.live_job): a rerun re-attaches."""
        return f"{checkpoints}/live-{segment}.json"

    @staticmethod
    def steps_log(checkpoints: str) -> str:
        """The trainer's per-step records, beside the checkpoints they belong to (io.checkpoints): a resumed segment
        keeps the records up to its checkpoint (a declared output would be deleted with a failed job)."""
        return f"{checkpoints}/steps.jsonl"

    @staticmethod
    def evals_log(checkpoints: str) -> str:
        return f"{checkpoints}/evals.jsonl"

    @staticmethod
    def guard_log(checkpoints: str) -> str:
        """The loss-spike guard's skips and rollbacks (train.guard), kept like the step records."""
        return f"{checkpoints}/guard.jsonl"

    @staticmethod
    def spans_log(checkpoints: str) -> str:
        """Rank 0's ledger of where each job's time went (resilience.goodput.Span): the measured goodput's input."""
        return f"{checkpoints}/spans.jsonl"

    @staticmethod
    def jobs_log(checkpoints: str) -> str:
        """Every job train_segment submitted, how it ended and what the restart left out (resilience.ledger.JobRun)."""
        return f"{checkpoints}/jobs.jsonl"

    @staticmethod
    def hosts_log(checkpoints: str) -> str:
        """What Slurm did with each host the jobs ledger blames: a hold seen, a return (resilience.ledger.HostEvent)."""
        return f"{checkpoints}/hosts.jsonl"

    @staticmethod
    def faults_log(checkpoints: str) -> str:
        """fault.mtbf_s's clock and the failures it struck (resilience.arrivals.Arrival)."""
        return f"{checkpoints}/faults.jsonl"

    @property
    def train_dir(self) -> str:
        return f"{self.root}/train/{self.series}"

    def segment_report(self, segment: int | str) -> str:
        return f"{self.train_dir}/segment-{segment}.json"

    @staticmethod
    def segment_of(name: str) -> int | None:
        """The segment a summary's file name is of (segment-<i>.json); None: no summary's name."""
        match = SEGMENT_FILE.fullmatch(name)
        return int(match[1]) if match else None

    def segment_reports(self, segments: int) -> list[str]:
        return [self.segment_report(i) for i in range(segments)]

    @property
    def run_terms(self) -> str:
        """The campaign's measured terms so far (plan.from_run.RunTerms), train_segment after each segment: what
        `python -m trainflow.plan --from-run` and the report plan from."""
        return f"{self.train_dir}/terms.json"

    @property
    def run_record(self) -> str:
        """What the campaign is (train.run_record.RunRecord, rank 0 at each job's start): trainflow.status's entry."""
        return f"{self.train_dir}/run.json"

    @property
    def wandb(self) -> str:
        """W&B's files (observe.wandb: WANDB_DIR; offline runs until `wandb sync`)."""
        return f"{self.train_dir}/wandb"

    @property
    def mlflow_store(self) -> str:
        """MLflow's local store when observe.mlflow.uri is empty, one for every campaign of the run (a SQLite file:
        MLflow 3 keeps its plain file store in maintenance mode): mlflow ui --backend-store-uri sqlite:///<it>."""
        return f"{self.root}/mlflow.db"

    @property
    def mlflow_artifacts(self) -> str:
        """The artifacts (each job's config) of the MLflow experiments the local store creates."""
        return f"{self.root}/mlflow-artifacts"

    @property
    def tensorboard(self) -> str:
        """Rank 0's TensorBoard event files (observe.tensorboard): tensorboard --logdir <root>/train."""
        return f"{self.train_dir}/tensorboard"

    def profile(self, segment: int) -> str:
        """The profiler traces of a segment, rank<r>.json (observe.profile)."""
        return f"{self.train_dir}/profile/segment-{segment}"

    @property
    def power(self) -> str:
        """Each node's power samples (segment-<i>-<host>.jsonl) and GPU-state files (energy.node)."""
        return f"{self.train_dir}/power"

    @staticmethod
    def offload(offload_dir: str, rank: int) -> str:
        """A rank's offloaded activations under train.offload_dir, a folder on the fast tier the user names."""
        return f"{offload_dir}/rank{rank}"

    # -- what follows training ---------------------------------------------------------------------

    @property
    def verify_report(self) -> str:
        return f"{self.root}/verify.json"

    @property
    def evaluate_dir(self) -> str:
        """The evaluate stage's records of the series' checkpoints (segment-<i>.json) and its corpus task."""
        return f"{self.root}/evaluate/{self.series}"

    def evaluation(self, segment: int | str) -> str:
        """The scores of segment `segment`'s last checkpoint (trainflow.evaluate.records.EvalRecord)."""
        return f"{self.evaluate_dir}/segment-{segment}.json"

    @property
    def corpus_task(self) -> str:
        """The series' corpus task (evaluate.corpus_task), written atomically by each of its evaluate jobs (the same
        bytes: the corpus and the settings decide them) before it scores it."""
        return f"{self.evaluate_dir}/corpus-task.jsonl"

    @property
    def energy_report(self) -> str:
        return f"{self.root}/energy.json"

    @property
    def report(self) -> str:
        return f"{self.root}/report/report.md"

    @property
    def plots(self) -> list[str]:
        return [f"{self.root}/report/{name}.png" for name in PLOTS]

    # -- every stage -----------------------------------------------------------------------------

    def job_metrics(self, stage: str, job: str = "", segment: int | str = 0) -> str:
        """A job's metrics file (trainflow.stage.run_stage writes it): a stage's main job's, one of a stage's several
        jobs' (`job`: prepare_data's tokenizer and shards), or a training segment's, beside its summary."""
        if stage == "train_segment":
            return f"{self.train_dir}/metrics-{segment}.json"
        if stage == "evaluate":  # one job per evaluated segment of each series
            return f"{self.root}/metrics/evaluate/{self.series}/segment-{segment}.json"
        return f"{self.root}/metrics/{stage}/{job}.json" if job else f"{self.root}/metrics/{stage}.json"

    def run_metrics(self, segments: int, prepare_jobs: list[str] = ()) -> list[str]:
        """The metrics files account_energy and report read: every stage's before them, and prepare_data's
        tokenizer and shard jobs' when the workflow runs them as jobs of their own (`prepare_jobs`)."""
        return [
            *(self.job_metrics("prepare_data", job) for job in prepare_jobs),
            *(self.job_metrics(s) for s in ("prepare_data", "stage_data", "build_kernels", "validate_nccl")),
            *(self.job_metrics("train_segment", segment=i) for i in range(segments)),
            self.job_metrics("verify_checkpoint"),
        ]

    def log(self, stage: str, name: str | None = None) -> str:
        return f"{self.root}/logs/{stage}/{name or stage}.log"

    def submitit(self, stage: str) -> str:
        return f"{self.root}/submitit/{stage}"

    @property
    def kernel_cache(self) -> str:
        """The fp8 kernels' build cache (trainflow.fp8.cache): one build per key, loaded by every rank."""
        return f"{self.root}/kernels"

    @property
    def kernels_report(self) -> str:
        """build_kernels' record: what it built or found cached, or why it built nothing."""
        return f"{self.root}/kernels.json"

    def io_defaults(self, cfg: TrainflowConfig) -> dict[str, str | list[str]]:
        """Every io path of `cfg.stage` as the workflow passes it."""
        every = cfg.stage in EVERY_SEGMENT  # the other stages compose without a path per segment
        shard = cfg.job.removeprefix("shard-") if cfg.job.startswith("shard-") else "00000"
        return {
            "tokens": self.tokens,
            "tokenizer": self.tokenizer,
            "token_shard": self.token_shard(shard),
            "staged_tokens": self.staged_tokens,
            "nccl_report": self.nccl_report,
            "checkpoints": self.checkpoints,
            "segment_report": self.segment_report(cfg.segment),
            "segment_reports": self.segment_reports(cfg.train.segments) if every else [],
            "verify_report": self.verify_report,
            "corpus_task": self.corpus_task,
            "evaluation": self.evaluation(cfg.segment),
            "evaluations": [self.evaluation(i) for i in cfg.evaluate.segments(cfg.train.segments)] if every else [],
            "energy_report": self.energy_report,
            "job_metrics": self.job_metrics(cfg.stage, cfg.job, cfg.segment),
            "run_metrics": self.run_metrics(cfg.train.segments) if every else [],
            "report": self.report,
            "plots": self.plots,
            "submitit": self.submitit(cfg.stage),
            "kernel_cache": self.kernel_cache,
            "kernels_report": self.kernels_report,
        }


def fill_io(cfg: TrainflowConfig) -> None:
    """Set every io path left empty to where the workflow would put it."""
    for name, value in RunFolder.of(cfg).io_defaults(cfg).items():
        if not getattr(cfg.io, name):
            setattr(cfg.io, name, value)
