"""io.init_from through the real launcher: a run started from a folder transformers wrote evaluates step 0 at
transformers' own validation loss, and its first losses are the same in dp2 x tp2 and pp2 as in one process; a run
started from the export of another run's checkpoint evaluates step 0 bitwise at that run's last evaluation, and
its checkpoints and summary record the folder."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

from tests.conftest import make_config, run_segment
from tests.support import hf_folder
from trainflow.checkpoint.folders import list_steps, step_dir
from trainflow.data.sampler import TokenSampler
from trainflow.export import export

RUN = ("train.segments=1", "train.segment_steps=2", "checkpoint.interval_steps=100", "model.init_std=0.3")
RTOL = 1e-5  # the golden-loss tolerance: layouts reduce in other orders


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    """A LlamaForCausalLM folder of the tiny model, bf16 in shards with an index, and transformers' model of it."""
    out = tmp_path_factory.mktemp("hf") / "llama"
    m = make_config("train_segment", out.parent, *RUN).model
    return out, hf_folder(out, m)


def transformers_val_loss(model, tokens: Path, cfg) -> float:
    """The trainer's evaluation (train.eval_batches global batches of the validation split), by transformers."""
    t, sampler = cfg.train, TokenSampler(tokens, seq_len=cfg.model.seq_len, seed=cfg.train.seed)
    losses = []
    with torch.no_grad():
        for i in range(t.eval_batches):
            inputs, targets = sampler.evaluation(i, t.global_batch, slice(0, t.global_batch))
            logits = model.eval()(inputs).logits
            losses.append(float(F.cross_entropy(logits.flatten(0, 1), targets.flatten())))
    sampler.close()
    return sum(losses) / len(losses)


@pytest.mark.slow  # 21 s; one layout's import is the exported checkpoint's test below, the reader's tests/unit's
def test_a_published_folder_starts_every_layout_at_the_same_loss(folder, fixed_tokens, tmp_path):
    path, theirs = folder
    runs = {
        layout: run_segment(tmp_path / layout, fixed_tokens, *RUN, f"parallel={layout}", f"io.init_from={path}")
        for layout in ("single", "dp2_tp2", "pp2_1f1b")
    }
    cfg = make_config("train_segment", tmp_path, *RUN, tokens=fixed_tokens)
    expected = transformers_val_loss(theirs, fixed_tokens, cfg)
    single = runs["single"]
    assert abs(single["evals"][0]["val_loss"] - expected) <= RTOL * expected
    for layout, summary in runs.items():
        assert summary["setup"]["init_from"] == str(path)
        for got, want in (
            (summary["steps"][0]["loss"], single["steps"][0]["loss"]),
            (summary["evals"][0]["val_loss"], single["evals"][0]["val_loss"]),
        ):
            assert abs(got - want) <= RTOL * want, (layout, got, want)


def test_an_exported_checkpoint_starts_a_run_bitwise_where_it_ended(fixed_tokens, tmp_path):
    first = run_segment(tmp_path / "a", fixed_tokens, *RUN)
    checkpoints = make_config("train_segment", tmp_path / "a", *RUN, tokens=fixed_tokens).io.checkpoints
    export(Path(checkpoints), tmp_path / "hf")
    init = f"io.init_from={tmp_path / 'hf'}"  # part of the campaign's identity: it names the series
    second = run_segment(tmp_path / "b", fixed_tokens, *RUN, init)
    assert second["evals"][0]["val_loss"] == first["evals"][-1]["val_loss"]  # bitwise: the same weights, batches
    assert second["setup"]["init_from"] == str(tmp_path / "hf") and first["setup"]["init_from"] is None
    series = make_config("train_segment", tmp_path / "b", *RUN, init, tokens=fixed_tokens).io.checkpoints
    manifest = json.loads((step_dir(series, list_steps(Path(series))[-1]) / "manifest.json").read_text())
    assert manifest["init_from"] == str(tmp_path / "hf")


@pytest.mark.slow
def test_sharded_data_parallel_with_fp8_starts_from_the_folder(folder, fixed_tokens, tmp_path):
    """FSDP2 shards and fp8's Float8Linear take the same weights (bf16 compute: a looser tolerance)."""
    path, _ = folder
    fp8 = ("train.precision=bf16", "train.fp8=delayed", f"io.init_from={path}")
    single = run_segment(tmp_path / "single", fixed_tokens, *RUN, "parallel=single", *fp8)
    shard = run_segment(tmp_path / "shard", fixed_tokens, *RUN, "parallel=dp2_shard", *fp8)
    assert abs(shard["evals"][0]["val_loss"] - single["evals"][0]["val_loss"]) <= 1e-2 * single["evals"][0]["val_loss"]
