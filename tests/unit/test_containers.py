"""The containers the ranks run in: the Alps EDF (profiles/slurm/alps.toml) parses and names the pinned image, the
Apptainer definition (containers/trainflow.def; Debian has no apptainer to build it here) has its sections and one
pinned digest, and cluster.allocation.container's values are refused in one line where they could reach a shell."""

from __future__ import annotations

import re
import tomllib

import pytest

from tests.conftest import REPO
from trainflow.config import compose
from trainflow.config.hashing import stage_hash
from trainflow.errors import ConfigError
from trainflow.torch_compat import SUPPORTED

DEF = REPO / "containers/trainflow.def"
EDF = REPO / "profiles/slurm/alps.toml"
DIGEST = r"sha256:[0-9a-f]{64}"


def sections(text: str) -> dict[str, str]:
    """An Apptainer definition's header (key: value lines before the first %section) and sections by name."""
    parts = re.split(r"^%(\w+)[ \t]*\n", text, flags=re.M)
    return {"header": parts[0], **dict(zip(parts[1::2], parts[2::2]))}


def test_the_apptainer_definition_builds_from_one_pinned_base():
    found = sections(DEF.read_text())
    header = dict(re.findall(r"^(\w+):[ \t]*(\S+)$", found["header"], flags=re.M))
    assert header["Bootstrap"] == "docker"
    base = re.fullmatch(rf"(nvcr\.io/nvidia/pytorch:[\d.]+-py3)@({DIGEST})", header["From"])
    assert base, f"From: {header['From']} is not an NGC PyTorch image pinned by digest"
    assert {"files", "post", "environment", "test", "labels", "runscript", "help"} <= set(found)
    # The one digest in all three places: the build, what the ranks record, the image's labels.
    assert f"export TRAINFLOW_IMAGE={header['From']}\n" in found["environment"]
    labels = dict(line.split(None, 1) for line in found["labels"].strip().splitlines())
    assert labels["org.opencontainers.image.base.name"] == base[1]
    assert labels["org.opencontainers.image.base.digest"] == base[2]
    assert "bash scripts/bootstrap.sh --system-torch" in found["post"]
    for line in found["files"].strip().splitlines():  # every copied source is the repository's
        source, target = line.split()
        assert (REPO / source).exists() and target.startswith("/opt/trainflow/"), line


def test_the_pinned_base_s_torch_is_in_the_supported_range():
    release = re.search(r"torch (\d+)\.(\d+)\.\d+a0", sections(DEF.read_text())["help"])
    assert release and SUPPORTED[0] <= (int(release[1]), int(release[2])) <= SUPPORTED[1]


def test_the_edf_parses_and_runs_the_same_image_with_the_network_hook():
    edf = tomllib.loads(EDF.read_text())
    assert edf["image"].endswith(".sqsh") and edf["writable"] is True
    assert all(re.fullmatch(r"[\w/${}.-]+:[\w/${}.-]+", m) for m in edf["mounts"]), edf["mounts"]
    base = re.search(r"^From: (\S+)$", DEF.read_text(), flags=re.M)[1]
    assert edf["env"]["TRAINFLOW_IMAGE"] == base  # the EDF's image is the Apptainer definition's base
    assert edf["env"]["PIP_USER"] == "1" and edf["env"]["PYTHONUSERBASE"].startswith("/capstor/")
    assert edf["annotations"]["com"]["hooks"]["aws_ofi_nccl"]["enabled"] == "true"


def test_the_slurm_profile_s_site_runs_the_ranks_in_the_edf():
    site = (REPO / "profiles/slurm/site.yaml").read_text().split('site: "', 1)[1].split('"', 1)[0].split()
    container = compose("train_segment", [*site, "experiment=llama70b_alps"]).cluster.allocation.container
    assert container.edf == str(EDF.relative_to(REPO)) and not container.sif


def test_the_container_is_in_no_hash():
    """Moving a campaign into an image keeps its checkpoint series (the report names a mixed stack instead)."""
    plain = compose("train_segment", ["cluster=slurm_local"])
    boxed = compose("train_segment", ["cluster=slurm_local", "cluster.allocation.container.sif=containers/t.sif"])
    assert stage_hash(plain, "train_segment") == stage_hash(boxed, "train_segment")


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        (["cluster.allocation.container.sif=t.sif"], "needs cluster.allocation.executor=slurm (here local)"),
        (["cluster.allocation.container.sif=t.img"], "container.sif(t.img) is not an Apptainer image (.sif)"),
        (["cluster.allocation.container.edf='a;b'"], "container.edf('a;b') must match"),
        (["cluster.allocation.container.edf=$HOME/a.toml"], "container.edf('$HOME/a.toml') must match"),
        (["cluster.allocation.container.edf=x/a.yaml"], "container.edf(x/a.yaml) is a path but not a .toml EDF"),
        (["cluster.allocation.container.sif=../t.sif"], "climbs out of its folder through '..'"),
        (["cluster.allocation.container.python='py`id`'"], "container.python('py`id`') must match"),
        (
            ["cluster.allocation.container.sif=t.sif", "cluster.allocation.container.binds=[/a:/b:rwx]"],
            "container.binds(['/a:/b:rwx']) must match",
        ),
        (["cluster.allocation.container.binds=[/a]"], "binds(['/a']) are Apptainer's: set"),
        (
            ["cluster.allocation.container.sif=t.sif", "cluster.allocation.container.edf=a"],
            "are both set: the ranks run in one container; keep one",
        ),
    ],
)
def test_a_bad_container_value_fails_in_one_line(overrides, message):
    cluster = [] if "executor=slurm" in message else ["cluster=slurm_local"]
    with pytest.raises(ConfigError) as err:
        compose("train_segment", [*cluster, *overrides])
    assert message in str(err.value) and "\n" not in str(err.value), str(err.value)
