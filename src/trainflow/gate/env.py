"""The audit of the ranks' NCCL environment: variables NCCL does not know, the seed's three among them.

    python -c "from trainflow.gate.env import audit_env; print(audit_env({'NCCL_TIMEOUT': '300'}))"

NCCL silently ignores variables it does not know, so a misspelt or invented one (the seed's
`NCCL_TIMEOUT`, `NCCL_NSOCKS_P2P_NIC`, `NCCL_GRAPH`) costs throughput without a word. Each
`NCCL_*` variable is checked against NCCL's documented names; the seed's three are mapped to the
real settings.
"""

from __future__ import annotations

# NCCL's documented environment variables (NCCL 2.2x user guide, "Environment Variables").
KNOWN_NCCL = {
    "NCCL_ALGO",
    "NCCL_PROTO",
    "NCCL_DEBUG",
    "NCCL_DEBUG_SUBSYS",
    "NCCL_DEBUG_FILE",
    "NCCL_SOCKET_IFNAME",
    "NCCL_SOCKET_FAMILY",
    "NCCL_SOCKET_NTHREADS",
    "NCCL_NSOCKS_PERTHREAD",
    "NCCL_CROSS_NIC",
    "NCCL_IB_HCA",
    "NCCL_IB_TIMEOUT",
    "NCCL_IB_RETRY_CNT",
    "NCCL_IB_GID_INDEX",
    "NCCL_IB_SL",
    "NCCL_IB_TC",
    "NCCL_IB_DISABLE",
    "NCCL_IB_QPS_PER_CONNECTION",
    "NCCL_IB_PCI_RELAXED_ORDERING",
    "NCCL_IB_ADAPTIVE_ROUTING",
    "NCCL_NET",
    "NCCL_NET_PLUGIN",
    "NCCL_NET_GDR_LEVEL",
    "NCCL_NET_GDR_READ",
    "NCCL_P2P_LEVEL",
    "NCCL_P2P_DISABLE",
    "NCCL_SHM_DISABLE",
    "NCCL_BUFFSIZE",
    "NCCL_NTHREADS",
    "NCCL_MAX_NCHANNELS",
    "NCCL_MIN_NCHANNELS",
    "NCCL_MAX_CTAS",
    "NCCL_MIN_CTAS",
    "NCCL_CHECKS_DISABLE",
    "NCCL_CHECK_POINTERS",
    "NCCL_LAUNCH_MODE",
    "NCCL_TOPO_FILE",
    "NCCL_TOPO_DUMP_FILE",
    "NCCL_GRAPH_FILE",
    "NCCL_GRAPH_DUMP_FILE",
    "NCCL_COLLNET_ENABLE",
    "NCCL_NVLS_ENABLE",
    "NCCL_CUMEM_ENABLE",
    "NCCL_NVB_DISABLE",
    "NCCL_PXN_DISABLE",
    "NCCL_P2P_PXN_LEVEL",
    "NCCL_RUNTIME_CONNECT",
    "NCCL_HOSTID",
    "NCCL_COMM_ID",
    "NCCL_IGNORE_CPU_AFFINITY",
    "NCCL_SET_THREAD_NAME",
    "NCCL_CONF_FILE",
    "NCCL_WORK_FIFO_DEPTH",
    "NCCL_SINGLE_RING_THRESHOLD",
    "NCCL_LL_THRESHOLD",
    "NCCL_TREE_THRESHOLD",
    "NCCL_NET_SHARED_BUFFERS",
    "NCCL_NET_SHARED_COMMS",
    "NCCL_ASYNC_ERROR_HANDLING",
    "NCCL_BLOCKING_WAIT",
    "NCCL_IB_SPLIT_DATA_ON_QPS",
    "NCCL_IB_MERGE_NICS",
    "NCCL_NVLS_NCHANNELS",
    "NCCL_DMABUF_ENABLE",
    "NCCL_P2P_NET_CHUNKSIZE",
    "NCCL_P2P_NVL_CHUNKSIZE",
    "NCCL_TUNER_PLUGIN",
    "NCCL_PROFILER_PLUGIN",
    "NCCL_SOCKET_RETRY_CNT",
    "NCCL_SOCKET_RETRY_SLEEP_MSEC",
}
# The seed's names that NCCL does not have, and what to use instead.
SEED_ALIASES = {
    "NCCL_TIMEOUT": "not an NCCL variable: set cluster.runtime.collective_timeout_s (PyTorch's init_process_group "
    "timeout, TORCH_NCCL_* watchdog); NCCL's transport timeout is NCCL_IB_TIMEOUT",
    "NCCL_NSOCKS_P2P_NIC": (
        "not an NCCL variable: sockets per connection are NCCL_NSOCKS_PERTHREAD x NCCL_SOCKET_NTHREADS"
    ),
    "NCCL_GRAPH": "not an NCCL variable: use NCCL_GRAPH_FILE (with NCCL_TOPO_FILE for the topology)",
}


def audit_env(env: dict[str, str]) -> list[str]:
    """Warnings about NCCL_* variables NCCL will ignore, each naming the fix."""
    warnings = []
    for name in sorted(k for k in env if k.startswith("NCCL_")):
        if name in SEED_ALIASES:
            warnings.append(f"{name} is {SEED_ALIASES[name]}")
        elif name not in KNOWN_NCCL:
            warnings.append(f"{name} is not a documented NCCL variable and is silently ignored; check its spelling")
    return warnings
