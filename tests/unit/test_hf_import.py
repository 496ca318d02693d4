"""io.init_from, one process: a folder transformers writes (bf16, sharded with its index) gives trainflow's Llama
transformers' own logits; an export of a trainflow checkpoint imports bitwise; the export streams shards with an
index that transformers reads; and every bad folder is refused in one line by the pre-flight checks (when the DAG is
built, and again by each stage), before anything runs or is written."""

from __future__ import annotations

import json
import logging
import re
import shutil
from pathlib import Path

import pytest
import torch
import transformers
from omegaconf import OmegaConf
from safetensors.torch import load_file

from tests.conftest import make_config
from tests.support import hf_folder, newest, trained
from trainflow.checkpoint.hf_reader import load_hf
from trainflow.config import ConfigError, ModelConfig, compose
from trainflow.data.sampler import TokenSampler
from trainflow.export import export, read_model
from trainflow.hf.llama import hf_name, parameter_shapes
from trainflow.model import Llama, cross_entropy
from trainflow.stage import run_stage

TOLERANCE = 1e-4  # max abs logit difference, fp32 (the same tolerance as the export's comparison)
OVERRIDES = ("model.init_std=0.3",)  # attention far from uniform: a wrong q/k layout would show in the logits
DEEP = 100_000  # nesting of a hostile JSON file: past Python's recursion limit


def model_config(tmp_path: Path, *overrides: str) -> ModelConfig:
    return make_config("train_segment", tmp_path, *OVERRIDES, *overrides).model


@pytest.fixture(scope="module")
def published(tmp_path_factory) -> tuple[Path, transformers.LlamaForCausalLM, ModelConfig]:
    out = tmp_path_factory.mktemp("hf") / "llama"
    m = model_config(out.parent)
    return out, hf_folder(out, m), m


def test_a_folder_transformers_wrote_gives_transformers_logits(published):
    folder, theirs, m = published
    assert len(list(folder.glob("*.safetensors"))) > 2 and (folder / "model.safetensors.index.json").is_file()
    ours = Llama(m)
    done = load_hf(folder, [ours], m)
    assert done.tensors == len(parameter_shapes(m)) and done.bytes == 4 * ours.num_params()
    ours_by_hf = {hf_name(k): v for k, v in ours.state_dict().items()}
    saved = load_file(next(folder.glob("*.safetensors")))
    assert saved and all(t.dtype == torch.bfloat16 and torch.equal(ours_by_hf[k], t.float()) for k, t in saved.items())
    ids = torch.randint(0, m.vocab_size, (2, m.seq_len), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        a, b = ours.eval()(ids), theirs.eval()(ids).logits
    assert a.std() > 1 and (a - b).abs().max() <= TOLERANCE  # far from uniform, and the same


def test_parameter_shapes_are_the_models(tmp_path):
    for preset in ("tiny", "llama3_8b"):
        m = make_config("train_segment", tmp_path, f"model={preset}").model
        with torch.device("meta"):
            assert parameter_shapes(m) == {k: tuple(v.shape) for k, v in Llama(m).state_dict().items()}


def test_an_export_imports_bitwise_and_streams_shards_transformers_reads(tmp_path, tokens):
    """A trained run's checkpoint exported in shards and imported again gives bitwise the logits and loss of the
    checkpoint's own model (what resuming it loads); transformers reads the sharded export."""
    cfg = trained(tmp_path / "run", tokens, "parallel=single", *OVERRIDES)
    out = tmp_path / "export"
    export(Path(cfg.io.checkpoints), out, max_shard_bytes=1_000_000)
    shards = sorted(p.name for p in out.glob("*.safetensors"))
    index = json.loads((out / "model.safetensors.index.json").read_text())
    assert len(shards) >= 3 and sorted(set(index["weight_map"].values())) == shards
    resumed, imported = Llama(cfg.model), Llama(cfg.model)
    resumed.load_state_dict(read_model(newest(cfg), cfg.model, fix=""))
    load_hf(out, [imported], cfg.model)
    sampler = TokenSampler(tokens, seq_len=cfg.model.seq_len, seed=0)
    inputs, targets = sampler.evaluation(0, 4, slice(0, 4))
    sampler.close()
    with torch.no_grad():
        a, b = resumed(inputs), imported(inputs)
        assert torch.equal(a, b) and torch.equal(cross_entropy(a, targets), cross_entropy(b, targets))
        hf = transformers.LlamaForCausalLM.from_pretrained(out, dtype=torch.float32)
        assert (hf.eval()(inputs).logits - a).abs().max() <= TOLERANCE


def damaged(published, tmp_path: Path, damage) -> Path:
    """A copy of the published folder, damaged by damage(folder)."""
    copy = tmp_path / "llama"
    shutil.copytree(published[0], copy)
    damage(copy)
    return copy


def edit_config(**changes):
    def damage(folder: Path) -> None:
        config = json.loads((folder / "config.json").read_text())
        (folder / "config.json").write_text(json.dumps({**config, **changes}))

    return damage


def truncate(folder: Path) -> None:
    shard = sorted(folder.glob("*.safetensors"))[1]
    shard.write_bytes(shard.read_bytes()[:-1000])


def rename_tensor(folder: Path) -> None:
    from safetensors.torch import load_file, save_file

    shard = sorted(folder.glob("*.safetensors"))[0]
    tensors = load_file(shard)
    save_file({name.replace("model.", "transformer."): t for name, t in tensors.items()}, shard)


def reshape_tensor(folder: Path) -> None:
    from safetensors.torch import load_file, save_file

    shard = folder / json.loads((folder / "model.safetensors.index.json").read_text())["weight_map"]["lm_head.weight"]
    tensors = load_file(shard)
    tensors["lm_head.weight"] = tensors["lm_head.weight"][:-1]
    save_file(tensors, shard)


def pickles_only(folder: Path) -> None:
    for path in [*folder.glob("*.safetensors*")]:
        path.unlink()
    (folder / "pytorch_model.bin").write_bytes(b"a pickle that would run code")


BAD = {
    "no folder": (lambda f: shutil.rmtree(f), r"io\.init_from\(.*llama\) is no folder"),
    "no config.json": (
        lambda f: (f / "config.json").unlink(),
        r"io\.init_from\(.*llama\) has no config\.json; give the folder",
    ),
    "malformed config.json": (
        lambda f: (f / "config.json").write_text('{"hidden_size": 128,'),
        r"config\.json is no readable JSON \(",
    ),
    "a list": (lambda f: (f / "config.json").write_text("[1, 2]"), r"config\.json holds a JSON list, not an object"),
    "a deep config.json": (
        lambda f: (f / "config.json").write_text("[" * DEEP + "]" * DEEP),
        r"llama/config\.json is no readable JSON \(maximum recursion depth exceeded",
    ),
    "a deep index": (
        lambda f: (f / "model.safetensors.index.json").write_text('{"weight_map": ' + "[" * DEEP + "]" * DEEP + "}"),
        r"llama/model\.safetensors\.index\.json is no safetensors index \(maximum recursion depth exceeded",
    ),
    "a string field": (edit_config(hidden_size="128"), r"gives hidden_size as '128', not a int"),
    "another model": (
        edit_config(
            num_hidden_layers=32,
            hidden_size=4096,
            intermediate_size=14336,
            vocab_size=128256,
            num_attention_heads=32,
            num_key_value_heads=8,
            rope_parameters={"rope_type": "default", "rope_theta": 500000.0},  # transformers 5's place for it
            head_dim=128,
        ),
        r"describes another model: model\.vocab_size\(257\) but vocab_size 128256, model\.dim\(128\) but hidden_size "
        r"4096, .*; model=llama3_8b matches it",
    ),
    "other eps": (
        edit_config(rms_norm_eps=1e-6),
        r"model\.norm_eps\(1e-05\) but rms_norm_eps 1e-06; set "
        r"model\.norm_eps=1e-06 to match it",
    ),
    "rope scaling": (
        edit_config(rope_parameters={"rope_type": "yarn", "factor": 8.0, "rope_theta": 10000.0}),
        r"describes rotary scaling 'yarn' \(.*llama3\), which trainflow's Llama does not compute",
    ),
    "tied": (
        edit_config(tie_word_embeddings=True),
        r"model\.tie_embeddings\(False\) but tie_word_embeddings True; set model\.tie_embeddings=true to match it",
    ),
    "truncated": (truncate, r"model-00002-of-\d+\.safetensors cannot be read as safetensors \(.*\): it is truncated"),
    "renamed tensors": (rename_tensor, r"holds transformer\.embed_tokens\.weight, which a LlamaForCausalLM of 4"),
    "a wrong shape": (
        reshape_tensor,
        r"holds lm_head\.weight of shape \(256, 128\) where a LlamaForCausalLM .* has "
        r"\(257, 128\)",
    ),
    "pickles only": (pickles_only, r"holds pytorch_model\.bin but no safetensors: pickle files can run code"),
    "an unlisted file": (
        lambda f: shutil.copy(next(f.glob("*.safetensors")), f / "extra.safetensors"),
        r"llama holds the unlisted extra\.safetensors",
    ),
}


@pytest.mark.parametrize("case", BAD, ids=list(BAD))
def test_a_bad_folder_is_refused_in_one_line_before_anything_runs(published, tmp_path, case):
    damage, match = BAD[case]
    folder = damaged(published, tmp_path, damage)
    with pytest.raises(ConfigError, match=match) as err:
        make_config("train_segment", tmp_path, *OVERRIDES, f"io.init_from={folder}")
    assert "\n" not in str(err.value) and not (tmp_path / "runs").exists()


def test_a_stage_refuses_a_folder_damaged_after_the_dag_was_built(published, tmp_path, caplog):
    """Composition checks the config alone; the pre-flight checks read the folder, and run_stage runs them again
    before its stage, so a folder that broke since the workflow checked it stops the stage in one line."""
    damage, match = BAD["truncated"]
    folder = damaged(published, tmp_path, damage)
    cfg = compose(
        "train_segment", ["experiment=smoke", f"storage.root={tmp_path}", *OVERRIDES, f"io.init_from={folder}"]
    )
    with pytest.raises(SystemExit, match="1"), caplog.at_level(logging.ERROR):
        run_stage(OmegaConf.structured(cfg), lambda cfg: pytest.fail("the stage ran"))
    (line,) = [r.getMessage() for r in caplog.records if r.levelno == logging.ERROR]
    assert re.search(f"^ConfigError: config cannot run here: .*{match}", line) and "\n" not in line


@pytest.mark.parametrize(
    ("override", "match"),
    [
        (
            "model.rope_scaling=llama3",
            r"model\.rope_scaling\(llama3\) but rope_scaling none; model=tiny matches it",
        ),
        (
            "model.tie_embeddings=true",
            r"model\.tie_embeddings\(True\) but tie_word_embeddings False; model=tiny matches it",
        ),
    ],
)
def test_a_model_configured_to_scale_rope_or_tie_its_head_is_not_a_plain_folders(published, tmp_path, override, match):
    """config.json without rotary scaling and with a head of its own describes neither, whatever the shapes say."""
    with pytest.raises(ConfigError, match=match):
        make_config("train_segment", tmp_path, *OVERRIDES, override, f"io.init_from={published[0]}")
