"""Llama 3.1 / 3.2 folders both ways: a transformers LlamaForCausalLM with llama3 rotary scaling, tied or not,
gives its own logits after io.init_from reads it into trainflow, and again after the run's checkpoint is exported;
what trainflow cannot compute, or a model that differs from the folder's, is refused in one line; so is a folder that
says two things (its rotary settings twice, differently; a NaN; a tied head beside a different lm_head.weight), each
with a fix that works when followed."""

from __future__ import annotations

import dataclasses
import json
import re
import shutil
from pathlib import Path

import pytest
import torch
import transformers
from safetensors import safe_open

from tests.conftest import make_config, run_segment
from tests.support import hf_folder
from trainflow.checkpoint.hf_reader import load_hf
from trainflow.config import ModelConfig
from trainflow.export import export, read_model
from trainflow.hf.llama import HfFolderError, check_config
from trainflow.hf.weights import weight_files
from trainflow.model import Llama

TOLERANCE = 1e-4  # max abs logit difference, fp32
# Original context 32 within the tiny model's 128 positions: wavelengths below 8 keep their frequency, those over 32
# slow by 8, the ones between are interpolated, so each branch of the scaling shows in the logits.
LLAMA3 = ("model.rope_scaling=llama3", "model.rope_original_seq_len=32", "model.init_std=0.3")
KINDS = {"llama3_1": LLAMA3, "llama3_2": (*LLAMA3, "model.rope_factor=32.0", "model.tie_embeddings=true")}


def transformers_folder(out: Path, m: ModelConfig) -> transformers.LlamaForCausalLM:
    """transformers' own random LlamaForCausalLM of the model `m` (its rotary scaling and tying), saved in fp32."""
    return hf_folder(out, m, dtype=torch.float32, shard="5GB")


def logits(model: torch.nn.Module, m: ModelConfig) -> torch.Tensor:
    ids = torch.randint(0, m.vocab_size, (2, m.seq_len), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        out = model(ids)
    return out.logits if hasattr(out, "logits") else out


def tensor_names(folder: Path) -> set[str]:
    names = set()
    for file in folder.glob("*.safetensors"):
        with safe_open(str(file), framework="numpy") as f:
            names |= set(f.keys())
    return names


@pytest.mark.parametrize("kind", sorted(KINDS))
def test_a_llama3_folder_gives_transformers_logits_imported_and_exported(kind, tmp_path, fixed_tokens):
    m = make_config("train_segment", tmp_path, *KINDS[kind], tokens=fixed_tokens).model
    theirs = transformers_folder(tmp_path / "in", m)
    assert ("lm_head.weight" in tensor_names(tmp_path / "in")) is not m.tie_embeddings  # a tied folder has none
    check_config(tmp_path / "in", m)
    ours = Llama(m)
    load_hf(tmp_path / "in", [ours], m)
    expected = logits(theirs, m)
    assert expected.std() > 1  # far from uniform: a wrong frequency would show
    assert (logits(ours.eval(), m) - expected).abs().max() <= TOLERANCE
    plain = Llama(m.__class__(**{**vars(m), "rope_scaling": "none"}))
    load_hf(tmp_path / "in", [plain], m)
    assert (logits(plain.eval(), m) - expected).abs().max() > 100 * TOLERANCE  # the scaling is what matches

    run = ("parallel=single", "train.segment_steps=2", "checkpoint.interval_steps=100", f"io.init_from={tmp_path}/in")
    cfg = make_config("train_segment", tmp_path / "run", *KINDS[kind], *run, tokens=fixed_tokens)
    run_segment(tmp_path / "run", fixed_tokens, *KINDS[kind], *run)
    (tmp_path / "out").mkdir()
    checkpoint = export(Path(cfg.io.checkpoints), tmp_path / "out")
    config = json.loads((tmp_path / "out/config.json").read_text())
    assert config["tie_word_embeddings"] is m.tie_embeddings and config["rope_scaling"]["factor"] == m.rope_factor
    assert ("lm_head.weight" in tensor_names(tmp_path / "out")) is not m.tie_embeddings
    check_config(tmp_path / "out", m)  # the export reads back as the model it came from
    trained = Llama(m)
    trained.load_state_dict(read_model(checkpoint, m, fix=""))
    exported = transformers.LlamaForCausalLM.from_pretrained(tmp_path / "out", dtype=torch.float32).eval()
    assert (logits(trained.eval(), m) - logits(exported, m)).abs().max() <= TOLERANCE
    assert (logits(trained, m) - expected).abs().max() > 100 * TOLERANCE  # it trained: the export is no copy


def edited(folder: Path, out: Path, **changes) -> Path:
    """A copy of the folder's config.json with `changes` (None deletes a key); the weights left out."""
    out.mkdir()
    config = json.loads((folder / "config.json").read_text())
    for key, value in changes.items():
        config.pop(key, None) if value is None else config.__setitem__(key, value)
    (out / "config.json").write_text(json.dumps(config))
    return out


@pytest.fixture(scope="module")
def tied_folder(tmp_path_factory, fixed_tokens) -> tuple[Path, ModelConfig]:
    root = tmp_path_factory.mktemp("tied")
    m = make_config("train_segment", root, *KINDS["llama3_2"], tokens=fixed_tokens).model
    transformers_folder(root / "hf", m)
    return root / "hf", m


@pytest.mark.parametrize(
    ("changes", "match"),
    [
        # transformers before 4.43 spelled the kind `type`, as many Llama 2 long-context folders still do
        (
            {"rope_parameters": None, "rope_scaling": {"type": "linear", "factor": 4.0}},
            r"describes rotary scaling 'linear' \(.*\), which trainflow's Llama does not compute",
        ),
        ({"rope_parameters": None, "rope_scaling": {"type": "dynamic", "factor": 2.0}}, r"rotary scaling 'dynamic'"),
        ({"rope_parameters": {"rope_type": "yarn", "factor": 4.0}}, r"rotary scaling 'yarn'"),
        ({"rope_parameters": None, "rope_scaling": "linear"}, r"rope_scaling 'linear', which is no object"),
        ({"rope_parameters": None, "rope_scaling": [8.0]}, r"rope_scaling \[8\.0\], which is no object"),
        ({"tie_word_embeddings": "yes"}, r"gives tie_word_embeddings as 'yes', not true or false"),
        (
            {"rope_parameters": {"rope_type": "llama3", "factor": "8", "rope_theta": 1e4}},
            r"rope_scaling\.factor as '8', not a float",
        ),
        # the folder's model against the configured one: each difference named with the override that matches
        (
            {"rope_parameters": None, "rope_scaling": None, "rope_theta": 10000.0},
            r"model\.rope_scaling\(llama3\) but rope_scaling none; .*model\.rope_scaling=none",
        ),
        (
            {
                "rope_parameters": {
                    "rope_type": "llama3",
                    "factor": 8.0,
                    "low_freq_factor": 1.0,
                    "high_freq_factor": 4.0,
                    "original_max_position_embeddings": 32,
                    "rope_theta": 10000.0,
                }
            },
            r"model\.rope_factor\(32\.0\) but rope_scaling\.factor 8\.0; .*model\.rope_factor=8\.0",
        ),
        ({"tie_word_embeddings": False}, r"model\.tie_embeddings\(True\) but tie_word_embeddings False"),
    ],
)
def test_what_trainflow_cannot_start_from_is_refused_in_one_line(tied_folder, tmp_path, changes, match):
    folder, m = tied_folder
    with pytest.raises(HfFolderError, match=match) as err:
        check_config(edited(folder, tmp_path / "edited", **changes), m)
    assert "\n" not in str(err.value)


def rope(folder: Path) -> dict:
    return json.loads((folder / "config.json").read_text())["rope_parameters"]


@pytest.mark.parametrize(
    ("twice", "line", "wrong"),
    [
        # issue 43, case 5: trainflow read rope_parameters' factor 32, transformers 5.25 rope_scaling's 8
        (
            lambda params: {"rope_scaling": {**params, "factor": 8.0}},
            "gives factor twice and they differ: 32.0 in rope_parameters, 8.0 in rope_scaling",
            "rope_scaling",
        ),
        (
            lambda params: {"rope_theta": params["rope_theta"] * 50},
            "gives rope_theta twice and they differ: 500000.0 at the top, 10000.0 in rope_parameters",
            "rope_theta",
        ),
    ],
)
def test_a_folder_that_gives_its_rotary_settings_twice_and_differently_is_refused(
    tied_folder, tmp_path, twice, line, wrong
):
    folder, m = tied_folder
    with pytest.raises(HfFolderError) as err:
        check_config(edited(folder, tmp_path / "twice", **twice(rope(folder))), m)
    assert line in str(err.value) and str(err.value).endswith("delete the wrong one from config.json")
    assert "\n" not in str(err.value)
    check_config(edited(folder, tmp_path / "fixed", **{**twice(rope(folder)), wrong: None}), m)  # the fix, followed
    check_config(edited(folder, tmp_path / "same", rope_scaling=rope(folder)), m)  # given twice alike: one model


def test_a_nan_rope_factor_is_refused_with_a_fix_that_works(tied_folder, tmp_path):
    """It was met with "set model.rope_factor=nan", which compose refuses in turn."""
    folder, m = tied_folder
    with pytest.raises(HfFolderError) as err:
        check_config(edited(folder, tmp_path / "nan", rope_parameters={**rope(folder), "factor": float("nan")}), m)
    line = str(err.value)
    assert "gives rope_scaling.factor as nan, which no model computes with; write the model's value" in line
    assert "model.rope_factor=nan" not in line and "\n" not in line
    llama3_2 = float(re.search(r"Llama 3\.2's (\S+)\)", line)[1])
    check_config(edited(folder, tmp_path / "fixed", rope_parameters={**rope(folder), "factor": llama3_2}), m)


def with_head(folder: Path, out: Path, head) -> Path:
    """A copy of the tied folder whose safetensors also hold lm_head.weight = head(the embedding)."""
    from safetensors.torch import load_file, save_file

    shutil.copytree(folder, out)
    (path,) = out.glob("*.safetensors")
    tensors = load_file(path)
    tensors["lm_head.weight"] = head(tensors["model.embed_tokens.weight"]).contiguous()
    save_file(tensors, path, metadata={"format": "pt"})
    return out


def test_a_tied_folder_that_also_holds_its_head_is_read_as_transformers_reads_it(tied_folder, tmp_path):
    """Issue 43, case 5: an equal lm_head.weight was refused with "download the model again", though transformers
    ties it; a different one, which transformers unties, is named with the settings that load that model."""
    folder, m = tied_folder
    equal = with_head(folder, tmp_path / "equal", lambda e: e.clone())
    weight_files(equal, m)
    ours = Llama(m)
    load_hf(equal, [ours], m)
    assert torch.equal(ours.output.weight, ours.tok_embeddings.weight)

    other = with_head(folder, tmp_path / "other", lambda e: e.flip(0))
    with pytest.raises(HfFolderError) as err:
        weight_files(other, m)
    line = str(err.value)
    assert "holds a lm_head.weight that differs from model.embed_tokens.weight, which transformers unties" in line
    assert line.endswith("set tie_word_embeddings to false in its config.json and give model.tie_embeddings=false")
    config = json.loads((other / "config.json").read_text())
    (other / "config.json").write_text(json.dumps({**config, "tie_word_embeddings": False}))
    untied = dataclasses.replace(m, tie_embeddings=False)
    check_config(other, untied)
    weight_files(other, untied)
