"""Score one checkpoint of the series on the downstream tasks (evaluate.*): segment i's last checkpoint, in a job of
its own that the workflow starts as soon as the segment lands, while the next segment trains (training never waits for
it).

    python -m trainflow.stages.evaluate segment=0 io.checkpoints=runs/default/capacity/checkpoints/<series>

What it reads: the segment's summary (io.segment_report: the step its last checkpoint is of), that checkpoint (its
files re-read against the manifest's CRC-32C, then every model tensor read in fp32 by DCP in one process, which
reassembles the training layout's shards: trainflow.export.source), the tokenizer the run's token file records
(io.tokens), and the task files (evaluate.tasks; with evaluate.corpus_task, the corpus task built from the run's own
corpus, written to io.corpus_task first). What it writes: the checkpoint's EvalRecord (io.evaluation), which the
report tabulates and plots against tokens, and trainflow.status shows.

One process, one device: the model is a single-device trainflow.model.Llama in fp32, on the GPU where
cluster.runtime.device is cuda and one is visible, else on the CPU. That holds the models one device holds (an 8B
model is 32 GB in fp32); a 70B checkpoint needs a sharded evaluation (the model spread over ranks as training holds it),
which is not built. The local task forms are scored by trainflow.evaluate.score, lm-evaluation-harness's tasks
(kind=harness) by the harness itself with this model answering (trainflow.evaluate.harness), offline.
"""

from __future__ import annotations

import time
from pathlib import Path

import torch

from trainflow.campaign.segments import lineage
from trainflow.checkpoint.folders import step_dir
from trainflow.config import ModelConfig, TrainflowConfig
from trainflow.config.evaluate import CORPUS_TASK
from trainflow.config.phases import phase_index
from trainflow.config.run_folder import RunFolder
from trainflow.config.sources import sources_of
from trainflow.data.index import first_shard
from trainflow.data.sampler import TokenSampler
from trainflow.data.tokenizer import load_tokenizer
from trainflow.energy.metrics import StageFigures
from trainflow.evaluate.corpus_task import write_corpus_task
from trainflow.evaluate.harness import score_harness
from trainflow.evaluate.harness_index import task_manager
from trainflow.evaluate.records import EvalRecord, TaskScore
from trainflow.evaluate.score import Tokenizer, score_task
from trainflow.evaluate.tasks import TaskKind, TaskSpec, TooFewDocuments
from trainflow.export.source import read_model, read_tokenizer
from trainflow.model import Llama, cross_entropy
from trainflow.records import read_record
from trainflow.stage import StageError, stage_log, stage_main, write_json
from trainflow.train.summary import SegmentSummary

log = stage_log(__file__)


def run(cfg: TrainflowConfig) -> StageFigures:
    io = cfg.io
    step = read_record(SegmentSummary, io.segment_report, rerun="train_segment").end_step
    checkpoint = step_dir(io.checkpoints, step)
    if not checkpoint.is_dir():
        raise StageError(
            f"segment {cfg.segment}'s last checkpoint (step {step}) is not in {io.checkpoints}: it was not saved yet "
            f"or was deleted; train segment {cfg.segment} first (snakemake --forcerun train_segment), then evaluate"
        )
    specs = task_specs(cfg)
    tokenizer = run_tokenizer(io.tokens, cfg.model)
    model = load_model(checkpoint, cfg.model, device=device_of(cfg))
    start = time.perf_counter()
    scores = score_tasks(model, tokenizer, specs, max_new_tokens=cfg.evaluate.max_new_tokens)
    validation = validation_losses(cfg, model)
    seconds = time.perf_counter() - start
    record = EvalRecord(RunFolder.of(cfg).series, step, trained_tokens(cfg, step), scores, seconds, validation)
    write_json(io.evaluation, record.to_json())
    for s in scores:
        norm = f", acc_norm {s.acc_norm:.3f}" if s.acc_norm is not None else ""
        log.info("Scored step %d on %s (%d items): acc %.3f%s", step, s.task, s.n, s.acc, norm)
    log.info("Wrote %s (%d tasks in %.1f s)", io.evaluation, len(scores), record.seconds)
    return StageFigures({"step": step, "tasks": len(scores), "items": sum(s.n for s in scores)})


@torch.no_grad()
def validation_losses(cfg: TrainflowConfig, model: Llama) -> dict[str, float]:
    """Each source's validation loss: the mean over train.eval_batches batches of its split, each the global batch
    the training ranks draw for it (data.sampler: seed, batch index), in one process. The ranks' own evaluation
    (train.eval_every) computes the same figure; a campaign that leaves it to this stage frees its training loop."""
    t, device = cfg.train, next(model.parameters()).device
    weights = {s.name: s.weight for s in sources_of(cfg.data)}
    sampler = TokenSampler(
        cfg.io.tokens, seq_len=cfg.model.seq_len, seed=t.seed, cross_document=t.cross_document, weights=weights
    )
    try:
        losses = {}
        for k, name in enumerate(sampler.names):
            batches = (sampler.evaluation(i, t.global_batch, slice(None), source=k) for i in range(t.eval_batches))
            per = [float(cross_entropy(model(x.to(device)), y.to(device))) for x, y in batches]
            losses[name] = sum(per) / len(per)
        return losses
    finally:
        sampler.close()


def trained_tokens(cfg: TrainflowConfig, step: int) -> int:
    """The tokens the campaign trained to `step` along the series' line: every completed segment's applied tokens (its
    kept summary's realised mixture), of this series to `step` and of each phase before it to where the next began (a
    branch's parent is not counted)."""
    run = RunFolder.of(cfg)
    chain = [*(p.series for p in cfg.phases[: phase_index(cfg)]), run.series]
    total, until = 0, step
    for series in reversed(chain):
        folder = run.series_checkpoints(series)
        done = lineage(folder).values()
        for line in done:
            if line.end_step <= until:
                kept = RunFolder.kept_summary(folder, line.segment)
                total += sum(share.tokens for share in read_record(SegmentSummary, kept, rerun="train_segment").mixture)
        until = min((line.start_step for line in done), default=0)
    return total


def score_tasks(model: Llama, tokenizer: Tokenizer, specs: list[TaskSpec], *, max_new_tokens: int) -> list[TaskScore]:
    """Each task's score in order: a local file's by trainflow.evaluate.score, a harness task's by lm-eval (its task
    index built once, only where there is one)."""
    harness = [s for s in specs if s.kind is TaskKind.HARNESS]
    manager = task_manager(harness) if harness else None
    return [
        score_harness(model, tokenizer, s, manager, max_new_tokens=max_new_tokens)
        if s.kind is TaskKind.HARNESS
        else score_task(model, tokenizer, s, max_new_tokens=max_new_tokens)
        for s in specs
    ]


def task_specs(cfg: TrainflowConfig) -> list[TaskSpec]:
    """The corpus task (written to io.corpus_task first) and evaluate.tasks, in that order."""
    e, specs = cfg.evaluate, []
    if e.corpus_task:
        source = sources_of(cfg.data)[0]  # a mixture's first source
        try:
            write_corpus_task(
                source.corpus,
                cfg.io.corpus_task,
                documents=e.corpus_documents,
                context_chars=e.corpus_context_chars,
                choice_chars=e.corpus_choice_chars,
                seed=e.corpus_seed,
                text_field=source.text_field,
            )
            specs.append(TaskSpec(CORPUS_TASK, "choice", cfg.io.corpus_task))
        except TooFewDocuments as err:  # a corpus too small for the default task trains all the same
            log.warning("No corpus task: %s (evaluate.corpus_task=false leaves it out)", err)
    return specs + [TaskSpec.of(t) for t in e.tasks]


def run_tokenizer(tokens: str, m: ModelConfig) -> Tokenizer:
    """The tokenizer the run's token files record (the first shard beside io.tokens' index), as training read it."""
    shard = first_shard(tokens)
    kind, text, _ = read_tokenizer(shard, m)
    return load_tokenizer(kind, text, origin=str(shard))


def load_model(checkpoint: Path, m: ModelConfig, *, device: torch.device) -> Llama:
    """The checkpoint's model as one single-device Llama (fp32, eval mode), its files CRC-checked as they are read."""
    state = read_model(checkpoint, m, fix="evaluate it with the phase's model config it was trained with")
    model = Llama(m)
    model.load_state_dict(state)
    return model.to(device).eval()


def device_of(cfg: TrainflowConfig) -> torch.device:
    cuda = cfg.cluster.runtime.device == "cuda" and torch.cuda.is_available()
    return torch.device("cuda" if cuda else "cpu")


if __name__ == "__main__":
    stage_main(run, config_name="evaluate")
