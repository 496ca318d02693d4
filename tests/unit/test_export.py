"""trainflow.export: a checkpoint of any layout becomes a LlamaForCausalLM folder whose logits equal
trainflow's, the model taken from its manifest; torch's own converter still reads trainflow checkpoints; a
forged manifest model, overrides that contradict it, and bad input fail in one line and write nothing."""

from __future__ import annotations

import json
import logging
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import transformers
from torch.distributed.checkpoint.format_utils import dcp_to_torch_save

from tests.conftest import REPO, make_config
from tests.support import newest, trained
from trainflow.checkpoint.manifest import MANIFEST
from trainflow.config import TrainflowConfig
from trainflow.config.run_folder import RunFolder
from trainflow.export import ExportError, choose_model, export, read_model
from trainflow.hf.write import HfWriteError
from trainflow.model import Llama
from trainflow.stages import prepare_data

TOLERANCE = 1e-4  # max abs logit difference, fp32


@pytest.fixture(scope="module")
def bpe_run(tmp_path_factory) -> TrainflowConfig:
    """One process, BPE tokens in the run folder (where prepare_data puts them), trained with delayed fp8: its
    checkpoint holds the amax histories beside the weights, which the export leaves out."""
    root = tmp_path_factory.mktemp("bpe")
    bpe = ("data=stdlib_bpe", f"data.corpus={REPO}/tests/assets/corpus/*.txt", "data.vocab_size=512")
    prepared = make_config("prepare_data", root, *bpe)
    prepare_data.run(prepared)
    fp8 = ("train.precision=bf16", "train.fp8=delayed")
    return trained(root, Path(prepared.io.tokens), "parallel=single", *bpe, *fp8)


@pytest.fixture(scope="module")
def tp2_run(tmp_path_factory, fixed_tokens) -> TrainflowConfig:
    """Two tensor-parallel ranks, byte tokens copied into the run folder."""
    root = tmp_path_factory.mktemp("tp2")
    cfg = trained(root, fixed_tokens, "parallel=tp2")
    shutil.copytree(fixed_tokens.parent, Path(RunFolder.of(cfg).tokens).parent)  # the index, shards, records
    return cfg


def logits_both_ways(cfg: TrainflowConfig, out: Path) -> tuple[torch.Tensor, torch.Tensor]:
    """Logits of the same tokens from trainflow's Llama and from the export. Both read the checkpoint through
    read_model, which test_torchs_own_converter_reads_a_trainflow_checkpoint holds to torch's own reading."""
    ids = torch.randint(0, cfg.data.vocab_size, (2, cfg.model.seq_len), generator=torch.Generator().manual_seed(0))
    ours = Llama(cfg.model)
    ours.load_state_dict(read_model(newest(cfg), cfg.model, fix=""))
    theirs = transformers.LlamaForCausalLM.from_pretrained(out, dtype=torch.float32)
    with torch.no_grad():
        return ours.eval()(ids), theirs.eval()(ids).logits


@pytest.mark.parametrize("run", ["bpe_run", "tp2_run"])
def test_exported_model_computes_trainflows_logits(run, request, tmp_path, caplog):
    cfg = request.getfixturevalue(run)
    caplog.set_level(logging.INFO, "trainflow.export")
    (tmp_path / "hf").mkdir()  # an empty OUT is taken
    export(Path(cfg.io.checkpoints), tmp_path / "hf")  # no overrides: the manifest says which model
    ours, theirs = logits_both_ways(cfg, tmp_path / "hf")
    assert ours.std() > 1  # far from a uniform prediction: the comparison below means something
    assert (ours - theirs).abs().max() <= TOLERANCE
    config = json.loads((tmp_path / "hf/config.json").read_text())
    assert config["intermediate_size"] == cfg.model.ffn_dim and config["num_key_value_heads"] == cfg.model.n_kv_heads
    if cfg.data.tokenizer == "bpe":
        tokenizer = transformers.AutoTokenizer.from_pretrained(tmp_path / "hf")
        assert tokenizer.convert_ids_to_tokens(config["eos_token_id"]) == "<|endoftext|>"
        assert tokenizer.decode(tokenizer("def f(x):\n    return x")["input_ids"]) == "def f(x):\n    return x"
    else:
        assert not (tmp_path / "hf/tokenizer.json").exists() and "tokenised by 'byte', which has none" in caplog.text


def test_torchs_own_converter_reads_a_trainflow_checkpoint(tp2_run, tmp_path):
    dcp_to_torch_save(newest(tp2_run), tmp_path / "whole.pt")
    whole = torch.load(tmp_path / "whole.pt", weights_only=True)
    model = read_model(newest(tp2_run), tp2_run.model, fix="")
    assert all(torch.equal(whole["model"][name], t) for name, t in model.items())


def copy_of(cfg: TrainflowConfig, tmp_path: Path) -> Path:
    """The run's newest checkpoint, copied into a series of its own."""
    copy = tmp_path / "series" / newest(cfg).name
    shutil.copytree(newest(cfg), copy)
    return copy


def test_a_corrupt_shard_fails_in_one_line_and_writes_nothing(tp2_run, tmp_path):
    checkpoint = copy_of(tp2_run, tmp_path)
    shard = checkpoint / "__1_0.distcp"
    data = bytearray(shard.read_bytes())
    data[len(data) // 2] ^= 0xFF
    shard.write_bytes(bytes(data))
    cmd = [sys.executable, "-m", "trainflow.export", str(checkpoint), str(tmp_path / "out/hf")]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    errors = [line for line in done.stderr.splitlines() if " ERROR " in line]
    assert done.returncode == 1 and len(errors) == 1 and "__1_0.distcp" in errors[0] and "CRC-32C" in errors[0]
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("where", ["holds a file", "inside the series"])
def test_an_out_folder_that_is_not_new_is_refused(tp2_run, tmp_path, where):
    checkpoint = copy_of(tp2_run, tmp_path)
    out = tmp_path / "hf" if where == "holds a file" else checkpoint.parent / "hf"
    if where == "holds a file":
        out.mkdir()
        (out / "keep.txt").write_text("mine")
    with pytest.raises(ExportError, match="already holds files|inside the checkpoint series"):
        export(checkpoint, out)
    assert [p.name for p in out.parent.iterdir() if p.name.startswith(".hf.")] == []
    if where == "holds a file":
        assert [p.name for p in out.iterdir()] == ["keep.txt"]


def with_model(cfg: TrainflowConfig, tmp_path: Path, forge) -> Path:
    """A copy of the run's newest checkpoint whose manifest records forge(the model it records), or no model
    where forge returns None. The manifest's CRCs cover the other files, not itself, so the copy still verifies:
    the forged model reaches export's own checks."""
    checkpoint = copy_of(cfg, tmp_path)
    manifest = json.loads((checkpoint / MANIFEST).read_text())
    if (model := forge(manifest.pop("model"))) is not None:
        manifest["model"] = model
    (checkpoint / MANIFEST).write_text(json.dumps(manifest))
    return checkpoint


FORGED = {
    "a string": (lambda m: {**m, "n_heads": "4"}, r"model\.n_heads\('4'\), which is no int"),
    "a bool": (lambda m: {**m, "n_layers": True}, r"model\.n_layers\(True\), which is no int"),
    "out of its domain": (lambda m: {**m, "n_heads": 0}, r"model\.n_heads\(0\) must be >= 1"),
    "NaN": (lambda m: {**m, "rope_theta": float("nan")}, r"model\.rope_theta\(nan\) must be a finite number"),
    "against a model rule": (lambda m: {**m, "n_kv_heads": 3}, r"model\.n_kv_heads\(3\) does not divide"),
    "an extra key": (lambda m: {**m, "layers\nX": 1}, r"holds a field ModelConfig has not, 'layers\\nX'"),
    "a missing key": (lambda m: {k: v for k, v in m.items() if k != "dim"}, r"lacks ModelConfig's field 'dim'"),
    "no object": (lambda m: [4, 128], r"records the model as \[4, 128\], not an object"),
    "a billion layers": (lambda m: {**m, "n_layers": 10**9}, r"too few or too narrow for n_layers\(1000000000\)"),
    "past int64": (lambda m: {**m, "dim": 2**40}, r"too few or too narrow for .* dim\(1099511627776\)"),
}


@pytest.mark.parametrize("forgery", FORGED, ids=list(FORGED))
def test_a_forged_manifest_model_fails_in_one_line_and_writes_nothing(tp2_run, tmp_path, forgery):
    forge, match = FORGED[forgery]
    checkpoint = with_model(tp2_run, tmp_path, forge)
    with pytest.raises(ExportError, match=match) as err:
        export(checkpoint, tmp_path / "hf")
    assert "\n" not in str(err.value) and not (tmp_path / "hf").exists()
    assert "give the run's model overrides" in str(err.value) or "export another one" in str(err.value)
    if "too few" not in match:  # a model this version cannot read gives way to overrides (their shapes are checked)
        assert choose_model(checkpoint, tp2_run.model) is tp2_run.model


def test_a_manifest_without_a_model_takes_the_runs_overrides(tp2_run, tmp_path):
    checkpoint = with_model(tp2_run, tmp_path, lambda m: None)
    with pytest.raises(ExportError, match=r"records no model: .*; give the run's model overrides \(e\.g\. model="):
        export(checkpoint, tmp_path / "hf")
    wrong = make_config("train_segment", tmp_path, "model.n_layers=2").model
    with pytest.raises(ExportError, match=r"holds the tensor model\.layers\.2\..* give the run's model overrides"):
        export(checkpoint, tmp_path / "hf", wrong)
    assert not (tmp_path / "hf").exists()
    export(checkpoint, tmp_path / "hf", tp2_run.model)
    assert (tmp_path / "hf/model.safetensors").is_file()


def test_overrides_must_repeat_the_manifests_model(tp2_run, tmp_path):
    assert choose_model(newest(tp2_run), tp2_run.model) == tp2_run.model
    wrong = make_config("train_segment", tmp_path, "model.n_layers=2").model
    with pytest.raises(ExportError, match=r"overrides give model\.n_layers\(2\) but .*manifest\.json records 4; drop"):
        export(newest(tp2_run), tmp_path / "hf", wrong)
    assert not (tmp_path / "hf").exists()


def test_a_full_disk_fails_in_one_line_and_leaves_nothing(tp2_run, request):
    full = request.getfixturevalue("tiny_tmpfs")  # 256 kB, the model 3.4 MB
    with pytest.raises(HfWriteError, match=r"writing .*/hf failed: .*No space left on device"):
        export(newest(tp2_run), full / "hf")
    assert list(full.iterdir()) == []
