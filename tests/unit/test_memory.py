"""trainflow.plan: the analytic memory model against the model's own parameter count, the pipeline
split and the measured peak of a real training step on the CPU."""

from __future__ import annotations

import contextlib
import functools
import subprocess
import sys
import threading

import pytest
import torch
import torch.distributed as dist
from torch.distributed.device_mesh import init_device_mesh

from trainflow.config import ConfigError, ParallelDims, compose
from trainflow.config.shape import block_params, linear_params, total_params
from trainflow.model import Llama, cross_entropy
from trainflow.parallel.data_parallel import apply_fsdp
from trainflow.parallel.pipeline import split_model
from trainflow.plan.memory import FP32, chunks_in_flight, device_memory
from trainflow.plan.peak import peak_bytes
from trainflow.plan.setup import model_counts
from trainflow.train.activations import apply_activations
from trainflow.train.controls import build_optimizer

SINGLE = ParallelDims(dp=1, tp=1, pp=1, world_size=1)
TOLERANCE = 0.25


@pytest.fixture
def one_thread():
    """One intra-op thread, as the trainer runs each rank (train.threads_per_rank): two spin on a busy machine."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@functools.cache
def config(*overrides: str):
    return compose("train_segment", list(overrides))


def model_config(name: str, *overrides: str):
    return config(f"model={name}", *overrides).model


def estimate(m, dims=SINGLE, **kw):
    kw = {"microbatch_size": 1, "precision": "fp32", "activations": "keep", **kw}
    return device_memory(m, dims, counts=model_counts(m, dims), **kw)


def sharded(dp: int, pp: int = 1) -> ParallelDims:
    return ParallelDims(dp=dp, tp=1, pp=pp, world_size=dp * pp, dp_mode="shard")


@contextlib.contextmanager
def fake_process_group(world: int):
    """A default process group of `world` ranks held by this process alone, as rank 0: torch's fake backend, whose
    collectives return at once and leave their outputs unset. FSDP allocates what it would on a real rank, and
    no collective frees a tensor on another thread, where the profiler would not see it."""
    from torch.testing._internal.distributed.fake_pg import FakeStore  # registers the "fake" backend

    dist.init_process_group("fake", store=FakeStore(), rank=0, world_size=world)
    try:
        yield
    finally:
        dist.destroy_process_group()


@pytest.mark.parametrize("name", ["tiny", "llama3_8b", "llama2_70b", "llama3_70b"])
def test_parameters_are_the_models(name):
    m = model_config(name)
    e = estimate(m)
    assert e.parameters == 4 * total_params(m)
    assert e.gradients == e.parameters and e.optimizer_state == 2 * e.parameters


def test_tensor_parallel_splits_the_block_linears_and_the_vocabulary_of_the_ends():
    m = model_config("llama3_70b")
    linears, ends = linear_params(m), 2 * m.vocab_size * m.dim  # the embedding and the output head
    sharded = estimate(m, ParallelDims(dp=1, tp=8, pp=1, world_size=8)).parameters // 4
    assert sharded == total_params(m) - (m.n_layers * linears + ends) * 7 // 8


def test_pipeline_ranks_hold_their_stage_of_the_model():
    m = model_config("tiny")
    with torch.device("meta"):
        model = Llama(m)
    for pp in (2, 4):
        stages = [split_model(model, s, pp).num_params() for s in range(pp)]
        # Under GPipe every rank holds all microbatches: the last rank, with the head, is the worst.
        worst = estimate(m, ParallelDims(dp=1, tp=1, pp=pp, world_size=pp, schedule="gpipe", microbatches=pp))
        assert worst.parameters == 4 * max(stages)
        assert worst.pp_rank == pp - 1 == stages.index(max(stages))


@pytest.mark.parametrize("name", ["tiny", "llama3_8b"])
@pytest.mark.parametrize("dp", [2, 3, 8])
def test_shard_divides_the_state_by_dp(name, dp):
    """FSDP's shards are equal in size (it pads them): parameters / dp rounded up, for gradients and AdamW too."""
    m = model_config(name)
    e = estimate(m, sharded(dp))
    assert e.parameters == 4 * -(-total_params(m) // dp)
    assert e.gradients == e.parameters and e.optimizer_state == 2 * e.parameters
    assert e.parameters * dp - 4 * total_params(m) < 4 * dp  # at most one padding element per rank


def test_only_shard_gathers():
    m = model_config("llama3_8b")
    for dims in (SINGLE, ParallelDims(dp=8, tp=1, pp=1, world_size=8), ParallelDims(dp=2, tp=1, pp=4, world_size=8)):
        assert estimate(m, dims).gathered == 0
    assert 0 < estimate(m, sharded(8)).gathered < estimate(m, ParallelDims(dp=8, tp=1, pp=1, world_size=8)).parameters


def test_shard_under_bf16_has_no_weight_copies():
    """FSDP's mixed precision gathers bf16 parameters in place of autocast's cached casts."""
    m = model_config("llama3_8b")
    assert estimate(m, ParallelDims(dp=8, tp=1, pp=1, world_size=8), precision="bf16").weight_copies > 0
    assert estimate(m, sharded(8), precision="bf16").weight_copies == 0


def test_shard_gathers_the_root_twice_when_it_outweighs_the_blocks():
    """Without a pipeline: the root unit (embedding, final norm, head) stays gathered, and as backward begins
    its all-gather output is there too; with a small vocabulary three blocks and a reduce-scatter input lead."""
    m = model_config("tiny", "model.vocab_size=65536")
    root = 2 * m.vocab_size * m.dim + m.dim
    assert estimate(m, sharded(2), precision="bf16").gathered == 2 * root * 2
    m = model_config("tiny")
    root, block, head = 2 * m.vocab_size * m.dim + m.dim, block_params(m), m.vocab_size * m.dim + m.dim
    assert estimate(m, sharded(2)).gathered == (root + 3 * block + head + block) * FP32


def test_shard_under_a_pipeline_gathers_the_whole_stage_with_fp32_gradients():
    """PipelineStage keeps FSDP from resharding and reducing until the last microbatch's backward."""
    m = model_config("llama3_8b")
    e = estimate(m, sharded(2, pp=4), precision="bf16")
    with torch.device("meta"):
        stage = split_model(Llama(m), e.pp_rank, 4).num_params()
    assert e.gathered >= stage * (2 + FP32)  # bf16 parameters, fp32 gradients


def test_microbatches_in_flight_follow_the_schedules():
    def dims(schedule, v=1):
        return ParallelDims(dp=1, tp=1, pp=4, world_size=4, virtual_stages=v, schedule=schedule, microbatches=8)

    assert [chunks_in_flight(dims("gpipe"), r) for r in range(4)] == [8, 8, 8, 8]
    assert [chunks_in_flight(dims("1f1b"), r) for r in range(4)] == [4, 3, 2, 1]
    # Korthikanti et al. 2022: the first rank holds n_layers * (1 + (pp - 1) / (pp * v)) layers' worth.
    n_layers, pp, v = 32, 4, 2
    layers = chunks_in_flight(dims("interleaved_1f1b", v), 0) * n_layers // (pp * v)
    assert layers == n_layers * (1 + (pp - 1) / (pp * v))


def test_the_memory_model_does_not_import_torch():
    code = "import sys, trainflow.plan.memory; sys.exit('torch' in sys.modules)"
    assert subprocess.run([sys.executable, "-c", code]).returncode == 0, "trainflow.plan.memory imported torch"


def test_bad_inputs_are_named():
    with pytest.raises(ConfigError, match=r"microbatch_size\(0\)"):
        estimate(model_config("tiny"), microbatch_size=0)


def test_peak_bytes_sees_a_known_tensor():
    held = [torch.ones(1)]
    assert 100_000_000 <= peak_bytes(lambda: torch.ones(25_000_000).sum()) < 100_001_000  # 100 MB fp32
    assert peak_bytes(held.pop) == 0  # freeing what was there before allocates nothing


def test_peak_bytes_takes_a_block_freed_on_another_thread_as_freed():
    """As gloo's threads free some of DDP's and FSDP's collective buffers, where the profiler records nothing."""

    def allocate_free_elsewhere_allocate():
        held = [torch.ones(25_000_000)]
        elsewhere = threading.Thread(target=held.clear)
        elsewhere.start()
        elsewhere.join()
        torch.ones(25_000_000)  # glibc maps it where the first one was

    assert 100_000_000 <= peak_bytes(allocate_free_elsewhere_allocate) < 100_001_000


@pytest.mark.parametrize("activations", ["keep", "recompute"])
@pytest.mark.parametrize(("precision", "batch", "seq"), [("fp32", 4, 512), ("bf16", 2, 256)])
def test_estimate_is_the_measured_step_peak(precision, batch, seq, activations, one_thread):
    """One AdamW step of the tiny model, at batches where keep's activations outweigh weights and AdamW state
    (10x under fp32; 1.7x under bf16, whose matmuls are slow on CPUs without bf16 instructions)."""
    m = model_config("tiny", f"model.seq_len={seq}")
    torch.manual_seed(0)
    model = Llama(m)
    apply_activations([model], activations)
    opt = build_optimizer(model, config().optim, torch.device("cpu"))
    for p in model.parameters():  # AdamW makes its state at the first step: make it now, outside the measure
        p.grad = torch.zeros_like(p)
    opt.step()
    opt.zero_grad()
    x, y = torch.randint(0, m.vocab_size, (2, batch, seq))

    def step():
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=precision == "bf16"):
            loss = cross_entropy(model(x), y)
        loss.backward()
        opt.step()
        opt.zero_grad()

    held = sum(p.nbytes for p in model.parameters()) + sum(t.nbytes for s in opt.state.values() for t in s.values())
    measured = held + peak_bytes(step)
    e = estimate(m, microbatch_size=batch, precision=precision, activations=activations, device="cpu")
    assert abs(e.total / measured - 1) <= TOLERANCE, f"estimate {e} vs measured {measured} bytes"


@pytest.mark.parametrize(
    ("dp", "precision", "vocab"),
    [(2, "fp32", 257), (4, "fp32", 257), (2, "bf16", 257), (2, "fp32", 8192)],
    ids=["dp2", "dp4", "dp2-bf16", "dp2-vocab8192"],
)
def test_shard_estimate_bounds_the_measured_step_peak(dp, precision, vocab, one_thread):
    """Two AdamW steps of the tiny model under FSDP on a fake group of dp ranks, at a batch (1 x 32 tokens) where
    the state and what FSDP gathers outweigh the activations; vocab 8192 makes the root unit (embedding and head)
    outweigh the blocks. The profiler watches from the model's build on, so it sees every block. The estimate is an
    upper bound: it counts the gradients whole and every activation at once, which the step never holds together.
    The profiler's records once missed a block in a full CI run (cause not found; alone it measures the same to
    the byte every time), so the larger of two measures is kept: a record missed twice still fails the test."""
    m = model_config("tiny", "model.seq_len=32", f"model.vocab_size={vocab}")
    x, y = torch.randint(0, vocab, (2, 1, m.seq_len))
    dtype = {"fp32": torch.float32, "bf16": torch.bfloat16}[precision]

    def two_steps():
        torch.manual_seed(0)
        model = Llama(m)
        apply_fsdp(
            [model], init_device_mesh("cpu", (dp,), mesh_dim_names=("dp",)), compute_dtype=dtype, pipelined=False
        )
        opt = build_optimizer(model, config().optim, torch.device("cpu"))
        for _ in range(2):
            opt.zero_grad(set_to_none=True)
            cross_entropy(model(x), y).backward()
            opt.step()

    with fake_process_group(dp):  # the larger of two: one full CI run measured dp4 an AdamW state (1.7 MB) low
        measured = max(peak_bytes(two_steps), peak_bytes(two_steps))
    e = estimate(m, sharded(dp), precision=precision, device="cpu")
    assert 1 <= e.total / measured <= 1 + TOLERANCE, f"estimate {e} vs measured {measured} bytes"
