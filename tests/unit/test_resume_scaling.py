"""A checkpoint resumes only with the rotary scaling and head tying its weights were trained with: the model's other
fields change shapes (which loading checks), these change what the same weights compute, so a resume that differs
in them is refused in one line before any step (checkpoint.manifest.scaling_mismatch). A manifest written before
these fields existed means no scaling and an untied head."""

from __future__ import annotations

import json

import pytest

from tests.conftest import make_config, run_segment
from trainflow.checkpoint.folders import list_steps, step_dir
from trainflow.checkpoint.manifest import MANIFEST, SCALING, read_manifest, scaling_mismatch
from trainflow.launch.job_end import LaunchError

RUN = ("parallel=single", "train.segments=2", "train.segment_steps=2", "checkpoint.interval_steps=2")


@pytest.fixture(scope="module")
def first_segment(tmp_path_factory, fixed_tokens):
    root = tmp_path_factory.mktemp("scaling")
    run_segment(root, fixed_tokens, *RUN, "segment=0")
    cfg = make_config("train_segment", root, *RUN, tokens=fixed_tokens)
    return root, step_dir(cfg.io.checkpoints, list_steps(cfg.io.checkpoints)[-1])


@pytest.mark.parametrize(
    ("override", "match"),
    [
        ("model.rope_scaling=llama3", r"model\.rope_scaling\(llama3\) but .*manifest\.json records 'none'"),
        ("model.tie_embeddings=true", r"model\.tie_embeddings\(True\) but .* records False"),
    ],
)
def test_a_resume_with_other_scaling_or_tying_is_refused_in_one_line(
    first_segment, fixed_tokens, override, match, tmp_path
):
    root, checkpoint = first_segment
    with pytest.raises(LaunchError, match=match) as err:
        # Another model is another campaign (trainflow.campaign refuses it in this run): it reaches these checkpoints
        # through io.resume_from.
        run_segment(tmp_path, fixed_tokens, *RUN, "segment=1", override, f"io.resume_from={checkpoint.parent}")
    assert "\n" not in str(err.value) and "resume with model." in str(err.value)
    assert list_steps(checkpoint.parent) == [2]  # no step ran


def test_scaling_parameters_count_only_where_either_side_scales(first_segment, fixed_tokens):
    root, checkpoint = first_segment
    manifest = read_manifest(checkpoint)
    plain = make_config("train_segment", root, *RUN, tokens=fixed_tokens).model
    assert scaling_mismatch(checkpoint / MANIFEST, manifest, plain) is None
    other_factor = make_config("train_segment", root, *RUN, "model.rope_factor=32.0", tokens=fixed_tokens).model
    assert scaling_mismatch(checkpoint / MANIFEST, manifest, other_factor) is None  # unused without scaling
    scaled = json.loads((checkpoint / MANIFEST).read_text())
    scaled["model"] |= {"rope_scaling": "llama3"}
    (checkpoint.parent / "scaled").mkdir()
    (checkpoint.parent / "scaled" / MANIFEST).write_text(json.dumps(scaled))
    manifest = read_manifest(checkpoint.parent / "scaled")
    wanted = make_config("train_segment", root, *RUN, "model.rope_scaling=llama3", tokens=fixed_tokens).model
    assert scaling_mismatch(checkpoint / MANIFEST, manifest, wanted) is None
    why = scaling_mismatch(checkpoint / MANIFEST, manifest, wanted.__class__(**{**vars(wanted), "rope_factor": 32.0}))
    assert why and "model.rope_factor(32.0) but" in why and "records 8.0" in why


def test_a_manifest_from_before_rope_scaling_reads_as_none(first_segment, tmp_path):
    _, checkpoint = first_segment
    old = json.loads((checkpoint / MANIFEST).read_text())
    for name in (*SCALING, "tie_embeddings"):
        del old["model"][name]
    (tmp_path / MANIFEST).write_text(json.dumps(old))
    manifest = read_manifest(tmp_path)
    m = manifest.recorded_model(tmp_path / MANIFEST)  # what the export rebuilds the model from
    assert (m.rope_scaling, m.tie_embeddings) == ("none", False)
    assert scaling_mismatch(tmp_path / MANIFEST, manifest, m) is None
