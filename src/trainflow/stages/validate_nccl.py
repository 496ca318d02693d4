"""Gate training on the collective network: an all_reduce bandwidth sweep over the training world.

    python -m trainflow.stages.validate_nccl cluster=alps_gh200 parallel=dp64_tp8_pp8

Launched like a training segment (same submitit job shape), so it measures the links training
will use. Bus bandwidth as nccl-tests defines it for all_reduce: algbw = bytes / time,
busbw = algbw * 2 (n - 1) / n. The largest message's busbw must reach cluster.gate.min_busbw_gbps
(seed checklist: >= 200 GB/s); below it, or with version/environment problems, the stage fails
and the DAG stops before training.

Before any job starts, the stage plans the run (trainflow.plan: memory, step split, throughput,
checkpoint interval, energy) and records the plan in its report under "plan"; a plan that does not fit
in device memory stops the stage, and with it the DAG, before any allocation or process group.
"""

from __future__ import annotations

import os
import time
from pathlib import Path

import hydra
import torch
import torch.distributed as dist
from omegaconf import DictConfig

from trainflow.atomic import write_text_atomic
from trainflow.config import CONF_DIR, ClusterConfig, TrainflowConfig
from trainflow.config.layout import ParallelDims
from trainflow.energy.meter import cpu_seconds
from trainflow.energy.nvml import NodeGpus
from trainflow.launch import LaunchError, build_executor, distributed_task, run_job
from trainflow.nccl_env import audit_env, node_checks, stripe_count, versions
from trainflow.parallel.gate import bus_factor, judge, time_patterns
from trainflow.plan.build import build_plan
from trainflow.stage import StageError, run_stage, stage_log, write_json

log = stage_log(__file__)


def sweep(cluster: ClusterConfig, device: torch.device) -> list[dict]:
    """Median all_reduce time per message size, measured after a warm-up; run on every rank."""
    world, rows = dist.get_world_size(), []
    for mb in cluster.gate.sweep_mb:
        n = int(mb * 2**20) // 4
        buf = torch.ones(n, dtype=torch.float32, device=device)
        dist.all_reduce(buf)  # warm-up: connection setup
        times = []
        for _ in range(cluster.gate.sweep_iters):
            dist.barrier()
            start = time.perf_counter()
            dist.all_reduce(buf)
            if device.type == "cuda":
                torch.cuda.synchronize()
            times.append(time.perf_counter() - start)
        t = sorted(times)[len(times) // 2]
        size = n * 4
        algbw = size / t / 1e9
        rows.append(
            {"bytes": size, "time_s": t, "algbw_gbps": algbw, "busbw_gbps": algbw * bus_factor("all_reduce", world)}
        )
        expected = float(world ** (cluster.gate.sweep_iters + 1))  # all ones, summed once per all_reduce
        if not torch.allclose(buf[:1].cpu(), torch.tensor([expected])):
            raise StageError(
                f"all_reduce of {size} bytes returned {buf[0].item()}, expected {expected}: the collective is broken"
            )
    return rows


def gpu_slowdowns() -> dict:
    """This node's GPUs' active hardware or thermal clock slowdowns (NVML), or why they cannot be read."""
    gpus, why = NodeGpus.open()
    if gpus is None:
        return {"gpu_slowdowns": None, "gpu_why": why}
    try:
        return {"gpu_slowdowns": gpus.slowdowns(), "gpu_why": ""}
    finally:
        gpus.close()


class BandwidthJob:
    """The submitit task: every rank sweeps the world and times the layout's patterns on its groups; rank 0
    returns every rank's rows and node facts."""

    def __init__(self, cfg: TrainflowConfig) -> None:
        self.cluster, self.parallel, self.model, self.global_batch = (
            cfg.cluster,
            cfg.parallel,
            cfg.model,
            cfg.train.global_batch,
        )

    def __call__(self) -> dict:
        with distributed_task(self.cluster.runtime) as (rank, world, device):
            rows, patterns = [], []
            if world > 1:
                rows = sweep(self.cluster, device)
                dims = ParallelDims.from_config(
                    self.parallel, self.model, world_size=world, global_batch=self.global_batch
                )
                nbytes = int(max(self.cluster.gate.sweep_mb) * 2**20)
                mesh = dims.build_mesh(device.type)
                patterns = time_patterns(dims, mesh, nbytes=nbytes, iters=self.cluster.gate.sweep_iters, device=device)
            hosts = [None] * world
            node = {**node_checks(), **gpu_slowdowns()}
            facts = {"host": os.uname().nodename, "node": node, "versions": versions(), "patterns": patterns}
            facts["cpu_s"] = cpu_seconds()  # this rank's CPU time: the stage's energy counts every rank's
            dist.all_gather_object(hosts, facts)
        return {
            "rank": rank,
            "world_size": world,
            "backend": self.cluster.runtime.backend,
            "sweep": rows,
            "hosts": hosts,
        }


def gate(result: dict, cluster: ClusterConfig) -> list[str]:
    """Reasons to stop before training (empty: go)."""
    problems = []
    if result["sweep"]:
        best = result["sweep"][-1]["busbw_gbps"]
        if best < cluster.gate.min_busbw_gbps:
            problems.append(
                f"all_reduce busbw {best:.3f} GB/s at {result['sweep'][-1]['bytes']} bytes is below "
                f"cluster.gate.min_busbw_gbps({cluster.gate.min_busbw_gbps}); "
                "check the network (NCCL_DEBUG=INFO) or lower the gate"
            )
    for row in result["patterns"]:
        if row["passed"] is False:
            problems.append(
                f"{row['pattern']} busbw {row['busbw_gbps']:.3f} GB/s on the slowest of its {row['groups']} groups "
                f"(ranks {row['slowest_group']}, hosts {','.join(row['slowest_hosts'])}) is below "
                f"cluster.gate.busbw_gbps.{row['pattern']}({row['threshold_gbps']})"
            )
    seen = {(h["versions"]["nccl"], h["versions"]["libfabric"]) for h in result["hosts"]}
    if len(seen) > 1:
        problems.append(
            f"NCCL/libfabric versions differ across nodes {sorted(map(str, seen))}: align them (seed: -30 % on Alps)"
        )
    problems += version_problems(result["hosts"], cluster.gate.versions_allowed)
    stripes = result.get("checkpoint_stripes", {}).get("count")
    if stripes is not None and 0 < stripes < cluster.gate.min_stripe_count:  # -1: striped over every target
        problems.append(
            f"the checkpoint folder's Lustre stripe count {stripes} is below cluster.gate.min_stripe_count("
            f"{cluster.gate.min_stripe_count}): lfs setstripe -c {cluster.gate.min_stripe_count} <folder> before "
            "training"
        )
    return problems


def version_problems(hosts: list[dict], allowed: dict[str, list[str]]) -> list[str]:
    """Nodes whose stack is not in the compatibility table (cluster.gate.versions_allowed), one line per component."""
    problems = []
    for component, prefixes in allowed.items():
        bad = sorted(
            {(h["host"], str(h["versions"].get(component))) for h in hosts}
            - {(h["host"], v) for h in hosts if (v := h["versions"].get(component)) and v.startswith(tuple(prefixes))}
        )
        if bad:
            found = ", ".join(f"{host}: {version}" for host, version in bad)
            problems.append(
                f"{component} {found} is not in cluster.gate.versions_allowed.{component} ({' | '.join(prefixes)}*); "
                "load the validated stack on those nodes or extend the table after validating it"
            )
    return problems


def run(cfg: TrainflowConfig) -> dict:
    plan = build_plan(cfg, with_remedies=False)
    if plan["memory"]["overflow"]:
        raise StageError(f"validate_nccl stopped before launching: {plan['memory']['overflow']}")
    log.info(
        "Planned %.3f s per step, %.1f tokens/s/device, %.2f GB of %.2f GB per device",
        plan["step"]["step_s"],
        plan["step"]["tokens_per_s_per_device"],
        plan["memory"]["total"] / 1e9,
        plan["memory"]["capacity"] / 1e9,
    )
    executor = build_executor(
        cfg.cluster.allocation,
        world_size=cfg.parallel.world_size,
        folder=cfg.io.submitit,
        name=f"{cfg.run}-validate_nccl",
    )
    try:
        result = run_job(executor, BandwidthJob(cfg))[0]
    except LaunchError as err:
        raise LaunchError(f"validate_nccl failed: {err}") from err
    hosts, rows = [h["host"] for h in result["hosts"]], [h.pop("patterns") for h in result["hosts"]]
    result["patterns"], exclude = judge(rows, hosts, cfg.cluster.gate.busbw_gbps)
    rank_cpu_s = sum(h.pop("cpu_s") for h in result["hosts"])  # the stage's energy counts every rank's CPU time
    for row in result["patterns"]:
        log.info(
            "%-17s %d groups of %d, %d bytes: slowest %.3f GB/s busbw (gate %s)",
            row["pattern"],
            row["groups"],
            row["group_size"],
            row["bytes"],
            row["busbw_gbps"],
            row["threshold_gbps"] if row["threshold_gbps"] is not None else "none",
        )
    folder = Path(cfg.io.checkpoints).parent  # the checkpoint series' parent: it exists before training
    folder.mkdir(parents=True, exist_ok=True)
    count, source = stripe_count(str(folder))
    result["checkpoint_stripes"] = {"folder": str(folder), "count": count, "source": source}
    result["env_warnings"] = audit_env({**os.environ, **cfg.cluster.runtime.env})
    result["threshold_gbps"] = cfg.cluster.gate.min_busbw_gbps
    result["plan"] = plan
    for row in result["sweep"]:
        log.info(
            "all_reduce %10d bytes: %8.3f ms, algbw %.3f GB/s, busbw %.3f GB/s",
            row["bytes"],
            row["time_s"] * 1e3,
            row["algbw_gbps"],
            row["busbw_gbps"],
        )
    if not result["sweep"]:
        log.info("World size 1: no collective to measure; the gate passes")
    for warning in result["env_warnings"]:
        log.warning("%s", warning)
    problems = gate(result, cfg.cluster)
    result["passed"] = not problems
    if exclude:  # the hosts of the slowest group of every pattern below its gate, in sbatch --exclude's form
        excluded = Path(cfg.io.nccl_report).with_name("nccl-exclude.txt")
        write_text_atomic(excluded, ",".join(exclude) + "\n")
        problems.append(f"hosts to leave out written to {excluded}: sbatch --exclude={','.join(exclude)}")
    if problems:
        raise StageError("validate_nccl failed: " + "; ".join(problems))
    write_json(cfg.io.nccl_report, result)
    log.info("Validated %s over %d ranks: passed", cfg.cluster.runtime.backend, result["world_size"])
    return {"ranks": result["world_size"], "rank_cpu_s": rank_cpu_s}


@hydra.main(version_base="1.3", config_path=str(CONF_DIR), config_name="validate_nccl")
def main(raw: DictConfig) -> None:
    run_stage(raw, run)


if __name__ == "__main__":
    main()
