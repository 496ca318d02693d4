"""The sbatch scripts submitit writes for the training job, snapshotted in golden files (no cluster needed).

    .venv/bin/python -m pytest tests/slurm/test_sbatch_script.py
    TRAINFLOW_REGEN_GOLDEN=1 .venv/bin/python -m pytest tests/slurm/test_sbatch_script.py   # after an intended change

The script is built exactly as train_segment submits it (trainflow.launch.build_executor) and read
through submitit's own `_make_submission_file_text`, so nothing is submitted. The folder and the
Python path are replaced by {folder} and {python}.
"""

from __future__ import annotations

import difflib
import os
import shlex
import sys
from pathlib import Path

import pytest
from submitit.slurm.slurm import SlurmExecutor

from tests.conftest import REPO
from trainflow.config import compose
from trainflow.errors import TrainflowError
from trainflow.launch import build_executor

GOLDEN = Path(__file__).parent / "golden"
REGEN = "TRAINFLOW_REGEN_GOLDEN"


def sbatch_script(overrides: list[str], folder: Path, monkeypatch) -> str:
    # SlurmExecutor refuses to exist where `srun` is not installed; the script text does not need it.
    monkeypatch.setattr(SlurmExecutor, "affinity", classmethod(lambda cls: 2))
    cfg = compose("train_segment", overrides)
    a = cfg.cluster.allocation
    executor = build_executor(  # as launch.segment_jobs builds the segment's job: supervised where there are spares
        a,
        world_size=cfg.parallel.world_size,
        folder=folder,
        name=f"{cfg.run}-train-{cfg.segment}",
        supervised=a.spare_nodes > 0,
    )
    slurm = executor._executor
    text = slurm._make_submission_file_text(slurm._submitit_command_str, "uid")
    return text.replace(str(folder), "{folder}").replace(shlex.quote(sys.executable), "{python}")


def assert_matches_golden(text: str, name: str) -> None:
    path = GOLDEN / name
    if os.environ.get(REGEN) == "1":
        path.parent.mkdir(exist_ok=True)
        path.write_text(text)
        return
    how = (
        f"if the change is intended, delete {path.relative_to(GOLDEN.parents[2])} and regenerate it: "
        f"{REGEN}=1 .venv/bin/python -m pytest {Path(__file__).relative_to(GOLDEN.parents[2])}"
    )
    if not path.exists():
        pytest.fail(f"no golden file {path}; {how}")
    expected = path.read_text()
    if text != expected:
        diff = "".join(difflib.unified_diff(expected.splitlines(True), text.splitlines(True), "golden", "generated"))
        pytest.fail(f"the sbatch script differs from {path.name}:\n{diff}\n{how}")


def sbatch_flags(text: str) -> dict[str, str]:
    return dict(
        line.removeprefix("#SBATCH --").partition("=")[::2]
        for line in text.splitlines()
        if line.startswith("#SBATCH --")
    )


def test_alps_70b_script(tmp_path, monkeypatch):
    text = sbatch_script(["experiment=llama70b_alps"], tmp_path, monkeypatch)
    assert_matches_golden(text, "alps_gh200.sbatch")
    flags = sbatch_flags(text)
    # dp64 x tp8 x pp8 = 4096 ranks on 1024 GH200 nodes, one task per GPU, and 12 spares
    # (cluster.allocation.spare_nodes) that launch.supervisor's hot restarts take: the job holds 1036 and survives a
    # node's failure (--no-kill).
    assert flags["nodes"] == "1036" and flags["ntasks-per-node"] == "4" and flags["gpus-per-node"] == "4"
    assert "no-kill" in flags
    assert flags["cpus-per-task"] == "72" and flags["mem"] == "460GB" and flags["time"] == "1440"  # 24 h
    assert flags["signal"] == "USR2@300"  # five minutes to save a 70B checkpoint before the limit
    assert flags["partition"] == "normal" and flags["account"] == "a-trainflow"
    assert flags["constraint"] == "'thp_never&vboost'"
    setup = text.split("# setup\n", 1)[1].split("\n\n", 1)[0].splitlines()
    assert setup[0].startswith("export CUDA_MPS_PIPE_DIRECTORY=")
    assert setup[1] == "srun --ntasks-per-node=1 nvidia-cuda-mps-control -d"  # CUDA MPS on every node (seed §3.2)
    assert text.rstrip().endswith("{python} -u -m submitit.core._submit {folder}")


def test_local_cluster_script(tmp_path, monkeypatch):
    text = sbatch_script(["experiment=smoke", "cluster=slurm_local"], tmp_path, monkeypatch)
    assert_matches_golden(text, "slurm_local.sbatch")
    flags = sbatch_flags(text)
    assert flags["nodes"] == "1" and flags["ntasks-per-node"] == "2" and flags["partition"] == "debug"
    assert flags["signal"] == "USR2@30" and "gpus-per-node" not in flags and "account" not in flags
    assert "# setup" not in text  # no empty setup section when the cluster has no setup lines


def test_a_restart_s_left_out_hosts_are_in_the_script(tmp_path, monkeypatch):
    monkeypatch.setattr(SlurmExecutor, "affinity", classmethod(lambda cls: 2))
    cfg = compose("train_segment", ["cluster=slurm_local"])
    executor = build_executor(
        cfg.cluster.allocation, world_size=2, folder=tmp_path, name="restart", exclude={"n2", "n1"}
    )
    slurm = executor._executor
    text = slurm._make_submission_file_text(slurm._submitit_command_str, "uid")
    assert "#SBATCH --exclude=n1,n2\n" in text and "--kill-on-bad-exit=1" in text


def site_overrides(profile: str) -> list[str]:
    """A Snakemake profile's site overrides (its site.yaml), as the workflow applies them before the user's."""
    return (REPO / f"profiles/{profile}/site.yaml").read_text().split('site: "', 1)[1].split('"', 1)[0].split()


def test_alps_runs_its_ranks_in_the_container_engine_environment(tmp_path, monkeypatch):
    """profiles/slurm's site puts the ranks in alps.toml's EDF: Pyxis's --environment on srun, the image's python3."""
    monkeypatch.chdir(REPO)  # the EDF's path is relative to where Snakemake runs
    text = sbatch_script([*site_overrides("slurm"), "experiment=llama70b_alps"], tmp_path, monkeypatch)
    assert_matches_golden(text, "alps_gh200_edf.sbatch")
    srun = text.rstrip().splitlines()[-1]
    # the supervisor is the job's one task, in the image as its steps' ranks are (launch.steps.SrunSteps)
    assert "--nodes=1 --ntasks=1 --environment=profiles/slurm/alps.toml python3 -u -m submitit.core._submit" in srun
    assert sbatch_flags(text)["nodes"] == "1036"  # the job's shape is the preset's, container or not


def test_an_apptainer_image_wraps_every_rank_s_python(tmp_path, monkeypatch):
    (tmp_path / "image").mkdir()
    image = tmp_path / "image/trainflow.sif"
    image.write_bytes(b"")  # build_executor checks that the image exists before submitting
    overrides = [
        "experiment=smoke",
        "cluster=slurm_local",
        f"cluster.allocation.container.sif={image}",
        "cluster.allocation.container.binds=[/scratch:/scratch:ro]",
    ]
    text = sbatch_script(overrides, tmp_path / "job", monkeypatch).replace(str(image), "{sif}")
    assert_matches_golden(text, "slurm_local_apptainer.sbatch")
    srun = text.rstrip().splitlines()[-1]
    assert srun.endswith(
        "apptainer exec --bind {folder} --bind /scratch:/scratch:ro {sif} python3 -u -m submitit.core._submit {folder}"
    )
    assert "--nv" not in srun  # CPU ranks: no GPU libraries to bind


def test_a_missing_image_is_refused_before_submitting(tmp_path, monkeypatch):
    monkeypatch.setattr(SlurmExecutor, "affinity", classmethod(lambda cls: 2))
    cfg = compose("train_segment", ["cluster=slurm_local", f"cluster.allocation.container.sif={tmp_path}/none.sif"])
    with pytest.raises(TrainflowError, match=r"container.sif\(.*none.sif\) is no file here; build it: apptainer build"):
        build_executor(cfg.cluster.allocation, world_size=2, folder=tmp_path, name="x")
