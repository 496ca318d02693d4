"""The software stack each rank records (trainflow.stack), the gate's verdict on nodes that differ, and the report's
section with its one line on a mixed-stack campaign."""

from __future__ import annotations

from types import SimpleNamespace

from trainflow.config.cluster import VERSION_COMPONENTS, GateConfig
from trainflow.gate.report import HostFacts, NodeFacts
from trainflow.gate.verdict import problems, version_problems
from trainflow.report.stack import stack_section
from trainflow.stack import NodeStack, mixed_stack, per_node, versions

IMAGE = "nvcr.io/nvidia/pytorch:26.06-py3@sha256:" + "4" * 64
NODE = NodeFacts(thp="never", swap_used_kb=0, mps_daemon=False, gpu_slowdowns=None, gpu_why="no GPU")


def stack(host: str, image: str | None = IMAGE, nccl: str = "2.27.3") -> NodeStack:
    return NodeStack(host, {**dict.fromkeys(VERSION_COMPONENTS), "image": image, "torch": "2.13.0", "nccl": nccl})


def test_a_rank_reads_its_image_and_versions_inside_its_environment():
    import torch

    mine = versions({"TRAINFLOW_IMAGE": IMAGE, "APPTAINER_CONTAINER": "/x/t.sif", "UENV_MOUNT_LIST": "a.sqfs:/u"})
    assert set(mine) == set(VERSION_COMPONENTS)
    assert mine["image"] == IMAGE and mine["uenv"] == "a.sqfs:/u" and mine["torch"] == torch.__version__
    assert versions({"APPTAINER_CONTAINER": "/x/t.sif"})["image"] == "/x/t.sif"  # an image not built by trainflow
    assert versions({})["image"] is None and versions({})["uenv"] is None


def test_the_gate_stops_on_nodes_that_run_different_stacks_and_pins_the_image():
    hosts = [HostFacts(s.host, NODE, s.versions) for s in (stack("n1"), stack("n2", image="other.sif"))]
    (line,) = problems([], [], hosts, None, GateConfig(min_busbw_gbps=0.0))
    assert "the software stack's versions differ across nodes (n1: nvcr.io" in line and "n2: other.sif" in line
    (pinned,) = version_problems(hosts, {"image": [IMAGE[:60]]})
    assert pinned.startswith("image n2: other.sif is not in cluster.gate.versions_allowed.image")


def test_one_stack_is_one_line_and_a_mixed_campaign_names_who_ran_what():
    gate = [stack("n1"), stack("n2")]
    assert mixed_stack({"validate_nccl": gate, "segment 0": gate}) is None
    line = mixed_stack({"validate_nccl": gate, "segment 0": gate, "segment 1": [stack("n1", nccl="2.21.5")]})
    assert line.startswith("Mixed software stack: segment 1 on nvcr.io/") and "NCCL 2.21.5" in line
    assert "validate_nccl, segment 0 on nvcr.io/" in line and "cluster.allocation.container" in line
    assert "\n" not in line
    assert per_node([stack("n1"), stack("n1"), stack("n2")]) == [stack("n1"), stack("n2")]


def test_the_report_lists_every_node_s_stack_and_says_when_it_was_mixed():
    nccl = SimpleNamespace(hosts=[HostFacts(s.host, NODE, s.versions) for s in (stack("n1"), stack("n1"))])
    segments = [SimpleNamespace(segment=0, stack=[stack("n1")]), SimpleNamespace(segment=1, stack=[stack("n1", None)])]
    lines = stack_section(nccl, segments)
    assert lines[0] == "## Software stack"
    assert f"| validate_nccl | n1 | {IMAGE} | - | 2.13.0 |" in "\n".join(lines)
    assert "| segment 1 | n1 | - | - | 2.13.0 |" in "\n".join(lines)
    assert lines[-2].startswith("Mixed software stack: segment 1 on no container, torch 2.13.0")
    one = stack_section(nccl, segments[:1])
    assert one[-2].startswith(f"One software stack for the gate and every recorded segment: {IMAGE}, torch 2.13.0")
