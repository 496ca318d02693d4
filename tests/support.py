"""What several test modules share that is no fixture (the fixtures are conftest's): the workflow's command line and
its job table, a free port for a one-process group, records made in a test (a step, a save, a job's metrics), the
package's layers, and the runs, states and folders more than one test module builds. No test module imports another
(tests/unit/test_layers.py checks it): what two share lives here."""

from __future__ import annotations

import re
import socket
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
import torch
from torch import nn

from tests.conftest import REPO, make_config, run_segment
from trainflow.checkpoint.folders import list_steps, step_dir
from trainflow.config import ModelConfig, TrainflowConfig
from trainflow.config.run_folder import RunFolder
from trainflow.data.sampler import TokenSampler
from trainflow.data.stream import DataStream, migrated
from trainflow.energy.metrics import JobMetrics
from trainflow.journal import Journal
from trainflow.resilience.goodput import Span
from trainflow.resilience.ledger import JobRun, jobs_ledger
from trainflow.stages import prepare_data

LAYERS = {
    "errors": 0,
    "torch_compat": 0,
    "atomic": 1,
    "crc": 1,
    "progress": 1,
    "records": 1,
    "tensors": 1,
    "host": 1,
    "badput": 1,
    "arguments": 1,
    "code_version": 2,
    "stream_position": 2,
    "config": 2,
    "journal": 2,
    "fp8": 3,
    "hf": 3,
    "data": 4,
    "model": 4,
    "checkpoint": 4,
    "parallel": 4,
    "energy": 4,
    "stack": 4,
    "preflight": 4,
    "plan": 5,
    "export": 5,
    "evaluate": 5,
    "resilience": 5,
    "campaign": 5,
    "train": 6,
    "gate": 6,
    "report": 7,
    "launch": 7,
    "stage": 7,
    "stages": 8,
    "status": 8,
}
"""The package's layers (docs/architecture.md, "Layers"): top-level module or package -> layer; each may import only
what lies below it (or itself). tests/unit/test_layers.py checks the imports, tests/workflow/test_docs.py the page."""

SNAKEMAKE = [sys.executable, "-m", "snakemake", "--snakefile", str(REPO / "Snakefile")]


def snakemake(workdir: Path, *args: str, check: bool = True) -> subprocess.CompletedProcess:
    """Snakemake on the repository's Snakefile in `workdir`; `output` holds both streams."""
    result = subprocess.run(
        [*SNAKEMAKE, "--directory", str(workdir), *args], capture_output=True, text=True, timeout=600
    )
    result.output = result.stdout + result.stderr
    if check and result.returncode:
        pytest.fail(
            f"snakemake {' '.join(args)} exited {result.returncode}:\n{result.stdout[-3000:]}\n{result.stderr[-3000:]}"
        )
    return result


def job_counts(output: str) -> dict[str, int]:
    """The `Job stats` table of a (dry) run."""
    table = output.split("Job stats:", 1)[1]
    return {m[1]: int(m[2]) for m in re.finditer(r"^(\w+)\s+(\d+)$", table, re.M) if m[1] != "total"}


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on right now."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def job_metrics(**fields: object) -> JobMetrics:
    """A job's metrics as run_stage would write them, these fields set and the rest empty."""
    base = {"stage": "s", "segment": 0, "job": "s", "wall_s": 1.0, "cpu_s": 0.0, "rapl_j": None, "gpu_j": None}
    return JobMetrics.from_json({**base, "host": "h", "slurm_job_id": None, "config": {}, **fields})


def marks(*rows: dict) -> list[SimpleNamespace]:
    """Step or save records with only the fields a test gives (the energy accounting reads them by name)."""
    return [SimpleNamespace(**row) for row in rows]


# A one-process checkpoint state (tests/unit/test_checkpoint_*.py).
def sample_state() -> dict:
    g = torch.Generator().manual_seed(0)
    return {
        "model": {
            "w": torch.randn(64, 32, generator=g),
            "w_t": torch.randn(16, 48, generator=g).t(),  # non-contiguous, storage exactly its size
            "half": torch.randn(40, generator=g).to(torch.bfloat16),
            "scalar": torch.tensor(3.5),
        },
        "step": torch.tensor(7),
    }


def blank_like(state: dict) -> dict:
    return {k: blank_like(v) if isinstance(v, dict) else torch.zeros_like(v) for k, v in state.items()}


def flat(state: dict, prefix: str = "") -> dict:
    out = {}
    for k, v in state.items():
        out.update(flat(v, f"{prefix}{k}.") if isinstance(v, dict) else {prefix + k: v})
    return out


def grads(layer: nn.Module, x: torch.Tensor, dy: torch.Tensor) -> tuple[torch.Tensor, ...]:
    """y, dx and dW of one forward and backward (gradients of earlier calls dropped); the fp8 tests'."""
    layer.zero_grad(set_to_none=True)
    x = x.detach().clone().requires_grad_()
    y = layer(x)
    y.backward(dy)
    return y, x.grad, layer.weight.grad


EXPORT_RUN = ("train.segments=1", "train.segment_steps=2", "checkpoint.interval_steps=100", "model.init_std=0.3")
"""Two steps, one checkpoint; init_std 0.3 (not 0.02) so attention is far from uniform and a wrong q/k layout or
rotary convention would show in the logits of an export or an import."""


def trained(root: Path, tokens: Path, *overrides: str) -> TrainflowConfig:
    """A run of EXPORT_RUN trained under `root`; its config."""
    run_segment(root, tokens, *EXPORT_RUN, *overrides)
    return make_config("train_segment", root, *EXPORT_RUN, *overrides, tokens=tokens)


def newest(cfg: TrainflowConfig) -> Path:
    """The run's newest checkpoint."""
    return step_dir(cfg.io.checkpoints, list_steps(cfg.io.checkpoints)[-1])


def hf_folder(out: Path, m: ModelConfig, *, dtype=torch.bfloat16, shard="600KB"):
    """transformers' own LlamaForCausalLM of the model `m` (its rotary scaling and tying too), saved to `out` as
    Meta's published ones are (bf16, in shards with an index); returned as transformers reads that folder in fp32."""
    import transformers  # only the Hugging Face tests load it

    scaling = None
    if m.rope_scaling == "llama3":
        scaling = {"rope_type": "llama3", "factor": m.rope_factor, "low_freq_factor": m.rope_low_freq_factor}
        scaling |= {"high_freq_factor": m.rope_high_freq_factor}
        scaling |= {"original_max_position_embeddings": m.rope_original_seq_len}
    config = transformers.LlamaConfig(
        vocab_size=m.vocab_size,
        hidden_size=m.dim,
        intermediate_size=m.ffn_dim,
        num_hidden_layers=m.n_layers,
        num_attention_heads=m.n_heads,
        num_key_value_heads=m.n_kv_heads,
        max_position_embeddings=m.seq_len,
        rope_theta=m.rope_theta,
        rope_scaling=scaling,
        rms_norm_eps=m.norm_eps,
        tie_word_embeddings=m.tie_embeddings,
        initializer_range=m.init_std,
    )
    torch.manual_seed(0)
    model = transformers.LlamaForCausalLM(config).to(dtype)
    model.save_pretrained(out, max_shard_size=shard)
    return transformers.LlamaForCausalLM.from_pretrained(out, dtype=torch.float32)  # as a user would read it


# A mixture of two corpora whose bytes tell them apart (tests/unit/test_mixture.py, tests/distributed/test_mixture.py).
WEIGHTS = {"letters": 0.25, "digits": 0.75}


def mixture(corpora: dict[str, str], weights: dict[str, float] = WEIGHTS, shards: dict[str, int] | None = None) -> str:
    """The data.sources override of named globs, weights (and shards)."""
    shards = shards or dict.fromkeys(weights, 1)
    items = ",".join(f"{{name:{n},corpus:'{corpora[n]}',weight:{w},shards:{shards[n]}}}" for n, w in weights.items())
    return f"data.sources=[{items}]"


def write_corpora(root: Path) -> dict[str, str]:
    """A folder of letter documents and one of digit documents, 30 of ~2 kB each."""
    rng, globs = np.random.default_rng(0), {}
    for name, alphabet in (("letters", "abcdefghijklm "), ("digits", "0123456789 ")):
        folder = root / name
        folder.mkdir(parents=True)
        for i in range(30):
            (folder / f"{i}.txt").write_text("".join(rng.choice(list(alphabet), size=2000)))
        globs[name] = f"{folder}/*.txt"
    return globs


def prepare_mixture(root: Path) -> tuple[Path, str]:
    """The index of the two sources' tokens (byte tokens, one shard each) and their data.sources override."""
    out, sources = root / "tokens/index.json", mixture(write_corpora(root))
    prepare_data.run(make_config("prepare_data", root, sources, f"io.tokens={out}"))
    return out, sources


# The layouts whose losses must match one process's (tests/distributed/test_parity.py, test_numerics.py).
STEPS = 10
# (preset, segments): the 3-D layout trains 2 segments of 5 steps, so its second half resumes
# from a checkpoint it wrote itself (DCP shards of 8 ranks).
LAYOUTS = [
    ("single", 1),
    ("dp2", 1),
    ("tp2", 1),
    ("pp2_gpipe", 1),
    ("pp2_1f1b", 1),
    ("pp2_interleaved", 1),
    ("tp2_pp2", 1),
    ("dp2_tp2", 1),  # GradReducer overlapped with backward, on DTensor gradients
    ("dp2_tp2_pp2", 2),
    # Sharded data parallel (FSDP2): alone, with TP, with PP, and all three resuming from its own checkpoint.
    ("dp2_shard", 1),
    pytest.param("dp2_shard_tp2", 1, marks=pytest.mark.slow),
    pytest.param("dp2_shard_pp2", 1, marks=pytest.mark.slow),
    pytest.param("dp2_shard_tp2_pp2", 2, marks=pytest.mark.slow),  # 56 s; dp2_tp2_pp2 resumes its own 3-D checkpoint
    # HSDP with TP (8 ranks); HSDP alone is checked below, with its placement of the state.
    pytest.param("dp4_hsdp2_tp2", 1, marks=pytest.mark.slow),
    # Context parallel (K and V all-gathered over cp): alone, beside tp, dp and a 1F1B pipeline.
    ("cp2", 1),
    pytest.param("cp2_tp2", 1, marks=pytest.mark.slow),
    pytest.param("dp2_cp2", 1, marks=pytest.mark.slow),
    pytest.param("cp2_pp2", 1, marks=pytest.mark.slow),
]


def layout_name(entry) -> str:
    return getattr(entry, "values", entry)[0]  # a pytest.param or a plain (name, segments)


# The restart drills' run (tests/integration/test_restarts.py, tests/slurm/test_restarts_on_slurm.py).
RESTART_RUN = (
    "parallel=dp2",
    "train.segments=1",
    "train.segment_steps=6",
    "checkpoint.interval_steps=2",
    "cluster.runtime.collective_timeout_s=60",
    "resilience.heartbeat_s=1",
)


def ledgers(root: Path, *extra: str) -> tuple[list[JobRun], list[Span]]:
    """The jobs ledger and the spans of a RESTART_RUN run under `root`."""
    folder = make_config("train_segment", root, *RESTART_RUN, *extra).io.checkpoints
    return jobs_ledger(folder).read(), Journal(RunFolder.spans_log(folder), Span).read()


def wandb_history(folder: Path) -> dict[int, dict]:
    """Every offline W&B run's logged rows under `folder` (WANDB_DIR), by step."""
    import json

    rows: dict[int, dict] = {}
    for record in wandb_records(folder, "history"):
        row = {i.key or "/".join(i.nested_key): json.loads(i.value_json) for i in record.history.item}
        rows.setdefault(row["_step"], {}).update(row)
    return rows


def wandb_records(folder: Path, kind: str) -> list:
    """The records of `kind` (history, run, ...) of every offline W&B run under `folder`, read from its .wandb files
    with W&B's own record type (wandb 0.31 ships no reader in Python): a LevelDB log of 32 KiB blocks after a 7-byte
    header, each chunk a CRC, a length, a type (1 whole, 2 first, 3 middle, 4 last) and part of one Record."""
    import struct

    from wandb.proto import wandb_internal_pb2

    found = []
    for path in sorted(folder.glob("wandb/offline-run-*/run-*.wandb")):
        data, pos, payload = path.read_bytes(), 7, b""
        assert data[:4] == b":W&B"
        while pos + 7 <= len(data):
            if (left := 32768 - pos % 32768) < 7:
                pos += left
                continue
            _crc, length, chunk = struct.unpack("<IHB", data[pos : pos + 7])
            payload, pos = payload + data[pos + 7 : pos + 7 + length], pos + 7 + length
            if chunk in (1, 4):
                record = wandb_internal_pb2.Record.FromString(payload)
                payload = b""
                if record.WhichOneof("record_type") == kind:
                    found.append(record)
    return found


def step_batch(sampler: TokenSampler, step: int, batch: int, rows: slice) -> tuple[torch.Tensor, torch.Tensor]:
    """Rows `rows` of training step `step` of a stream whose global batch was always `batch` (data.stream)."""
    weights = dict(zip(sampler.names, sampler.weights))
    position = migrated(step, [], batch=batch, weights=weights, seed=sampler.seed)
    return sampler.train(DataStream(position, weights=weights, seed=sampler.seed).take(batch), rows, block=batch)
