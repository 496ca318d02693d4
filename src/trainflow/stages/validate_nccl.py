"""Gate training on the collective network: an all_reduce bandwidth sweep over the training world.

    python -m trainflow.stages.validate_nccl cluster=alps_gh200 parallel=dp64_tp8_pp8

Launched like a training segment (same submitit job shape), so it measures the links training
will use. Bus bandwidth as nccl-tests defines it for all_reduce: algbw = bytes / time,
busbw = algbw * 2 (n - 1) / n. The largest message's busbw must reach cluster.min_busbw_gbps
(seed checklist: >= 200 GB/s); below it, or with version/environment problems, the stage fails
and the DAG stops before training.

Before any job starts, the stage plans the run (trainflow.plan: memory, step split, throughput,
checkpoint interval, energy) and records the plan in its report under "plan"; a plan that does not fit
in device memory stops the stage, and with it the DAG, before any allocation or process group.
"""

from __future__ import annotations

import logging
import os
import time

import hydra
import torch
import torch.distributed as dist
from omegaconf import DictConfig

from trainflow.config import CONF_DIR, ClusterConfig, TrainflowConfig
from trainflow.launch import LaunchError, build_executor, distributed_task, run_job
from trainflow.nccl_env import audit_env, node_checks, versions
from trainflow.plan.build import build_plan
from trainflow.stage import StageError, run_stage, write_json

log = logging.getLogger("trainflow.validate_nccl")


def bus_factor(world: int) -> float:
    """nccl-tests' all_reduce correction from algorithm to bus bandwidth."""
    return 2 * (world - 1) / world


def sweep(cluster: ClusterConfig, device: torch.device) -> list[dict]:
    """Median all_reduce time per message size, measured after a warm-up; run on every rank."""
    world, rows = dist.get_world_size(), []
    for mb in cluster.sweep_mb:
        n = int(mb * 2**20) // 4
        buf = torch.ones(n, dtype=torch.float32, device=device)
        dist.all_reduce(buf)  # warm-up: connection setup
        times = []
        for _ in range(cluster.sweep_iters):
            dist.barrier()
            start = time.perf_counter()
            dist.all_reduce(buf)
            if device.type == "cuda":
                torch.cuda.synchronize()
            times.append(time.perf_counter() - start)
        t = sorted(times)[len(times) // 2]
        size = n * 4
        rows.append(
            {"bytes": size, "time_s": t, "algbw_gbps": size / t / 1e9, "busbw_gbps": size / t / 1e9 * bus_factor(world)}
        )
        expected = float(world ** (cluster.sweep_iters + 1))  # all ones, summed once per all_reduce
        if not torch.allclose(buf[:1].cpu(), torch.tensor([expected])):
            raise StageError(
                f"all_reduce of {size} bytes returned {buf[0].item()}, expected {expected}: the collective is broken"
            )
    return rows


class BandwidthJob:
    """The submitit task: every rank sweeps, rank 0 returns the table."""

    def __init__(self, cluster: ClusterConfig) -> None:
        self.cluster = cluster

    def __call__(self) -> dict:
        with distributed_task(self.cluster) as (rank, world, device):
            rows = sweep(self.cluster, device) if world > 1 else []
            hosts = [None] * world
            dist.all_gather_object(hosts, {"host": os.uname().nodename, "node": node_checks(), "versions": versions()})
        return {"rank": rank, "world_size": world, "backend": self.cluster.backend, "sweep": rows, "hosts": hosts}


def gate(result: dict, cluster: ClusterConfig) -> list[str]:
    """Reasons to stop before training (empty: go)."""
    problems = []
    if result["sweep"]:
        best = result["sweep"][-1]["busbw_gbps"]
        if best < cluster.min_busbw_gbps:
            problems.append(
                f"all_reduce busbw {best:.3f} GB/s at {result['sweep'][-1]['bytes']} bytes is below "
                f"cluster.min_busbw_gbps({cluster.min_busbw_gbps}); "
                "check the network (NCCL_DEBUG=INFO) or lower the gate"
            )
    seen = {(h["versions"]["nccl"], h["versions"]["libfabric"]) for h in result["hosts"]}
    if len(seen) > 1:
        problems.append(
            f"NCCL/libfabric versions differ across nodes {sorted(map(str, seen))}: align them (seed: -30 % on Alps)"
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
        cfg.cluster, world_size=cfg.parallel.world_size, folder=cfg.io.submitit, name=f"{cfg.run}-validate_nccl"
    )
    try:
        result = run_job(executor, BandwidthJob(cfg.cluster))[0]
    except LaunchError as err:
        raise LaunchError(f"validate_nccl failed: {err}") from err
    result["env_warnings"] = audit_env({**os.environ, **cfg.cluster.env})
    result["threshold_gbps"] = cfg.cluster.min_busbw_gbps
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
    if problems:
        raise StageError("validate_nccl failed: " + "; ".join(problems))
    write_json(cfg.io.nccl_report, result)
    log.info("Validated %s over %d ranks: passed", cfg.cluster.backend, result["world_size"])
    return {"ranks": result["world_size"]}


@hydra.main(version_base="1.3", config_path=str(CONF_DIR), config_name="validate_nccl")
def main(raw: DictConfig) -> None:
    run_stage(raw, run)


if __name__ == "__main__":
    main()
