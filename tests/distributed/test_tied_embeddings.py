"""A head tied to the embedding (model.tie_embeddings) trains in any layout as in one process: under a pipeline the
first and last stage's copies are summed each step (trainflow.parallel.pipeline), the gradient norm counts the weight
once, a checkpoint reshards between pipeline and none, and its Hugging Face export is the whole embedding."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from tests.conftest import GOLDEN_RTOL, make_config, run_segment, step_losses
from trainflow.export import export
from trainflow.hf.llama import hf_config

STEPS = 6


@pytest.mark.parametrize(
    "layout", ["tp2_pp2", *(pytest.param(layout, marks=pytest.mark.slow) for layout in ("tp2", "dp2_shard", "dp2_tp2"))]
)
def test_a_tied_head_trains_as_in_one_process(layout, tmp_path, fixed_tokens):
    run = ("model.tie_embeddings=true", "train.global_batch=8", f"train.segment_steps={STEPS}")
    one = run_segment(tmp_path / "single", fixed_tokens, "parallel=single", *run)
    split = run_segment(tmp_path / layout, fixed_tokens, f"parallel={layout}", *run)
    assert split["setup"]["parameters"] == one["setup"]["parameters"]  # the whole model, the tied weight once
    for a, b in zip(step_losses(split), step_losses(one), strict=True):
        assert a == pytest.approx(b, rel=GOLDEN_RTOL)
    norms = [[r["grad_norm"] for r in s["steps"]] for s in (split, one)]
    assert norms[0] == pytest.approx(norms[1], rel=1e-4)  # the copy's gradient is not counted twice
    # The Hugging Face export of the split checkpoint (under tp: each rank's vocabulary rows) is the whole embedding.
    exported = {}
    for name in ("single", layout):
        series = make_config("train_segment", tmp_path / name, f"parallel={name}", *run, tokens=fixed_tokens)
        export(Path(series.io.checkpoints), tmp_path / f"hf-{name}")
        exported[name] = load_file(tmp_path / f"hf-{name}" / "model.safetensors")["model.embed_tokens.weight"]
    torch.testing.assert_close(exported[layout], exported["single"], rtol=1e-4, atol=1e-6)


@pytest.mark.slow  # ~90 s: two launcher runs, one of 4 ranks
def test_a_tied_llama3_folder_starts_the_pipeline_where_it_starts_one_process(tmp_path, fixed_tokens):
    """io.init_from a tied Llama 3.2-style folder (no lm_head.weight): the last stage's copy of the head reads the
    embedding's tensor, so tp2_pp2's losses are one process's."""
    import transformers  # only the Hugging Face tests load it

    model = ("model.tie_embeddings=true", "model.rope_scaling=llama3", "model.rope_original_seq_len=32")
    m = make_config("train_segment", tmp_path, *model, tokens=fixed_tokens).model
    config = {k: v for k, v in hf_config(m, None).items() if k not in ("architectures", "model_type", "torch_dtype")}
    torch.manual_seed(0)
    transformers.LlamaForCausalLM(transformers.LlamaConfig(**config)).save_pretrained(tmp_path / "hf")
    run = (*model, "train.global_batch=8", "train.segment_steps=2", f"io.init_from={tmp_path / 'hf'}")
    one = run_segment(tmp_path / "single", fixed_tokens, "parallel=single", *run)
    split = run_segment(tmp_path / "tp2_pp2", fixed_tokens, "parallel=tp2_pp2", *run)
    assert one["setup"]["init_from"] == split["setup"]["init_from"] == str(tmp_path / "hf")
    for a, b in zip(step_losses(split), step_losses(one), strict=True):
        assert a == pytest.approx(b, rel=GOLDEN_RTOL)


@pytest.mark.slow  # 16 s each; tp2_pp2's tied head above stays in the default suite
@pytest.mark.parametrize(("first", "second"), [("single", "pp2_1f1b"), ("pp2_1f1b", "single")])
def test_a_tied_model_resumes_across_pipeline_layouts(tmp_path, fixed_tokens, first, second):
    """The last stage's head copy keeps its AdamW state under the embedding's key, the one a process without a
    pipeline has, so DCP reshards a tied checkpoint both ways and 3 + 3 steps are 6 steps of one process."""
    run = ("model.tie_embeddings=true", "train.global_batch=8", "checkpoint.interval_steps=100")
    halves = (*run, "train.segments=2", "train.segment_steps=3")
    a = run_segment(tmp_path / "a", fixed_tokens, *halves, "segment=0", f"parallel={first}")
    checkpoints = make_config("train_segment", tmp_path / "a", *halves, f"parallel={first}", tokens=fixed_tokens)
    resume = f"io.resume_from={checkpoints.io.checkpoints}"
    b = run_segment(tmp_path / "b", fixed_tokens, *halves, "segment=1", f"parallel={second}", resume)
    whole = run_segment(tmp_path / "w", fixed_tokens, *run, "train.segment_steps=6", "parallel=single")
    assert step_losses(a, b) == pytest.approx(step_losses(whole), rel=GOLDEN_RTOL)
