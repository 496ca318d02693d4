"""Float8Linear: an nn.Linear whose three GEMMs run in fp8, with dynamic or delayed (amax-history) scaling per
tensor, or rowwise scaling (trainflow.fp8.rowwise: a scale per row of each operand; its own design note).

    layer = Float8Linear(1024, 4096, bias=False, recipe="delayed", history_len=16)
    y = layer(x); y.sum().backward(); sync_amax_history([model], None)   # once per optimizer step

Design note (the recipe of Transformer Engine and torchao's tensorwise float8, without their machinery):
- forward    y  = x W^T      x, W in e4m3                  fp8_gemm(xq, Wq)
- backward   dx = dy W       dy in e5m2, W in e4m3         fp8_gemm(dyq, Wq^T)
             dW = dy^T x     dy in e5m2, x in e4m3         fp8_gemm(dyq^T, xq^T)
  Each tensor has one scale (per tensor). Each cast also writes the transposed copy the backward GEMM reads
  (x^T for dW, W^T for dX, dY^T for dW), in the same pass (trainflow.fp8.fused), and only the transposes of x and W
  are saved for backward (1 byte per value). Accumulation is fp32;
  y comes out in the autocast dtype (else x's dtype), dx in x's dtype, dW in the weight's (the fp32 master
  weight under autocast, bf16 under FSDP2's mixed precision, which gathers the weight before forward).
- dynamic: each scale comes from the tensor's own amax, computed just before the cast.
- delayed: each scale comes from the largest amax of the last `history_len` optimizer steps; the amaxes seen
  during a step (every microbatch and recomputation: a max, so repeats change nothing) collect in
  `amax_pending` and enter the history when `sync_amax_history` runs, all-reduced (MAX) over the data-parallel
  and tensor-parallel groups, one collective each, so every rank scales identically. Until a history holds a
  value (the first step) the current amax is used. Once every row of a layer's history is positive (read once per
  step, in the sync) each scale is known before its cast, so each cast is one pass that also records the amax.
  The history is a persistent buffer, `amax_history`
  (3, history_len) with rows input / weight / grad_output, newest first: it is in the state_dict, so a resumed
  run scales as the uninterrupted one did. Values beyond a delayed scale's range saturate (cast.quantise).
Tensor parallel (trainflow.parallel.tensor_parallel: torch's ColwiseParallel / RowwiseParallel, which shard a
Float8Linear as any nn.Linear, which it is). The style makes the weight a DTensor (Shard(0) column-, Shard(1)
row-parallel), hands forward a DTensor input, takes a DTensor output back and runs every activation collective.
forward runs the three GEMMs on this rank's shards (to_local) and returns its output as the DTensor the style
expects (from_local: a column shard, or a Partial sum that RowwiseParallel all-reduces); a column-parallel input
gradient leaves as Partial, which ColwiseParallel's from_local sums. Chosen over torchao's Float8ColwiseParallel /
Float8RowwiseParallel: they cast to an fp8 tensor subclass that DTensor's matmul rules then run on, while our
GEMM is one custom op on plain tensors, which DTensor has no sharding rule for; so `SHARDS`, what DTensor would
have derived (which operand is sharded), is written here by hand.
- Scales. Each local GEMM is dequantised before partial outputs are summed, so per-shard scales would be correct,
  but they would quantise differently from one process. A scale is the whole tensor's amax instead (whole_amax:
  DTensor's amax of the shards, a MAX all-reduce over tp where the tensor is sharded: W in both styles, x
  row-parallel, grad_output column-parallel; none where it is replicated and so equal on every rank: x
  column-parallel, grad_output row-parallel), so every shard is quantised as one process quantises the whole.
- dynamic agrees at every GEMM (one 4-byte all-reduce per sharded tensor). delayed records local amaxes and the
  sync agrees them over tp once per step, so its GEMMs wait on no collective, except in the first step (before
  this process synced or loaded a history), which agrees its current amaxes as dynamic does; a later history
  row of zeros (a tensor all zero for history_len steps) falls back to the local amax, on every run alike.
- The amax buffers: distribute_module makes every buffer of a sharded module a Replicate DTensor; they are read
  and updated through their local tensor (`local`).
Tolerances (tests/unit/test_fp8.py): outputs and gradients equal the fp32 computation on the fp8-rounded
tensors up to fp32 summation order; against full-precision fp32 they are within the e4m3/e5m2 rounding bound.
At tp2 one block's loss and gradients match one process's to summation order (tests/unit/test_fp8_ranks.py holds
them to 1e-5 and 1e-3; per-shard scales would not); deeper, e5m2's 2 mantissa bits magnify a summation-order
difference that lands on a rounding boundary, so a step's gradients may differ by as much as fp8 rounding does, and
training runs are held to the loss-drift bounds of tests/distributed/test_numerics.py.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.tensor import DTensor, Partial, Placement, Replicate, Shard

from trainflow.config.schema import FP8_RECIPES as RECIPES
from trainflow.fp8.cast import E4M3, E5M2, amax, scale_from_amax
from trainflow.fp8.fused import cast_pair
from trainflow.fp8.ops import fp8_gemm, gemm_dtype
from trainflow.fp8.rowwise import rowwise_matmul
from trainflow.tensors import local

INPUT, WEIGHT, GRAD_OUTPUT = 0, 1, 2  # rows of amax_history / entries of amax_pending


@dataclass(frozen=True)
class Shards:
    """Where one tp rank's pieces of a linear lie in the whole tensors (the placements DTensor would give them)."""

    x: Placement
    y: Placement
    """This rank's GEMM output: a shard of the columns, or a partial sum the style all-reduces."""
    grad_y: Placement
    """The output's gradient as the style hands it back (the all-reduced output's is replicated)."""
    grad_x: Placement | None
    """This rank's input gradient: a partial sum under ColwiseParallel, which its from_local all-reduces; None:
    placed as the input is (RowwiseParallel: this rank's columns)."""


SHARDS = {
    Shard(0): Shards(x=Replicate(), y=Shard(-1), grad_y=Shard(-1), grad_x=Partial()),  # ColwiseParallel
    Shard(1): Shards(x=Shard(-1), y=Partial(), grad_y=Replicate(), grad_x=None),  # RowwiseParallel
}
"""By the weight's placement on the tp mesh."""


def delayed_amax(past: torch.Tensor, current: torch.Tensor) -> torch.Tensor:
    """The amax a delayed scale uses: the history's largest (`past`), or `current` while the history is empty."""
    return torch.where(past > 0, past, current)


def whole_amax(part: torch.Tensor, mesh: DeviceMesh, placement: Placement) -> torch.Tensor:
    """The amax of the whole tensor whose tp shard (or replica) `part` is: DTensor's amax, which all-reduces (MAX)
    over the mesh only where `placement` shards it."""
    return amax(DTensor.from_local(part, mesh, (placement,), run_check=False)).full_tensor()


class _Fp8Matmul(torch.autograd.Function):
    """y = x W^T with the three GEMMs in fp8 (see the module docstring); x (..., K), W (N, K), local tensors.
    grad_tp: (tp mesh, grad_output's placement) where grad_output's amax must be agreed over tp, else None.
    records: the pending amax slots of x and W that the casts fold |x| and |W| into (delayed, one pass), else None;
    one_pass: grad_output's scale comes from its history alone and its cast records its amax (trainflow.fp8.fused)."""

    @staticmethod
    def forward(
        ctx,
        x: torch.Tensor,
        weight: torch.Tensor,
        x_scale: torch.Tensor,
        w_scale: torch.Tensor,
        grad_past: torch.Tensor | None,
        grad_pending: torch.Tensor | None,
        out_dtype: torch.dtype,
        margin: int,
        grad_tp: tuple[DeviceMesh, Placement] | None,
        records: tuple[torch.Tensor | None, torch.Tensor | None],
        one_pass: bool,
    ) -> torch.Tensor:
        x2 = x.reshape(-1, x.shape[-1])  # (M, K)
        # Each cast also writes the transpose the backward GEMM reads: x^T for dW, W^T for dX; only those are saved.
        (xq, xqt), (wq, wqt) = cast_pair(x2, x_scale, E4M3, records[0]), cast_pair(weight, w_scale, E4M3, records[1])
        y = fp8_gemm(xq, wq, x_scale.reciprocal(), w_scale.reciprocal(), gemm_dtype(out_dtype))  # (M, N)
        ctx.save_for_backward(xqt, wqt, x_scale, w_scale, grad_past)
        # Not saved with save_for_backward: the buffer is updated in place by later microbatches (its version
        # counter would then refuse it), and this backward must add to it, not to a snapshot.
        ctx.grad_pending, ctx.grad_tp, ctx.one_pass = grad_pending, grad_tp, one_pass
        ctx.x_shape, ctx.x_dtype, ctx.w_dtype, ctx.margin = x.shape, x.dtype, weight.dtype, margin
        return y.to(out_dtype).reshape(*x.shape[:-1], wq.shape[0])

    @staticmethod
    def backward(ctx, grad_y: torch.Tensor):
        xqt, wqt, x_scale, w_scale, grad_past = ctx.saved_tensors
        g = grad_y.reshape(-1, grad_y.shape[-1])  # (M, N)
        if ctx.one_pass:  # delayed with a usable history: the scale first, the amax recorded by the cast itself
            g_scale = scale_from_amax(grad_past, E5M2, ctx.margin)
            gq, gqt = cast_pair(g, g_scale, E5M2, ctx.grad_pending)
        else:
            g_scale = grad_scale(g, grad_past, ctx.grad_pending, ctx.grad_tp, ctx.margin)
            gq, gqt = cast_pair(g, g_scale, E5M2)
        g_inv = g_scale.reciprocal()
        grad_x = grad_w = None
        if ctx.needs_input_grad[0]:  # (M, N) x (K, N)^T -> (M, K)
            grad_x = fp8_gemm(gq, wqt, g_inv, w_scale.reciprocal(), gemm_dtype(ctx.x_dtype))
            grad_x = grad_x.to(ctx.x_dtype).reshape(ctx.x_shape)
        if ctx.needs_input_grad[1]:  # (N, M) x (K, M)^T -> (N, K)
            grad_w = fp8_gemm(gqt, xqt, g_inv, x_scale.reciprocal(), torch.float32).to(ctx.w_dtype)
        return grad_x, grad_w, None, None, None, None, None, None, None, None, None


def grad_scale(
    g: torch.Tensor,
    grad_past: torch.Tensor | None,
    grad_pending: torch.Tensor | None,
    grad_tp: tuple[DeviceMesh, Placement] | None,
    margin: int,
) -> torch.Tensor:
    """grad_output's scale where its amax comes first (dynamic; delayed before its history is usable): the amax,
    recorded for the delayed history (local), agreed over tp where g is a shard, the history's where it has one."""
    g_amax = amax(g)
    if grad_pending is not None:  # delayed: record this (local) amax
        grad_pending.copy_(torch.maximum(grad_pending, g_amax))
    if grad_tp is not None:  # a shard of grad_output: the whole tensor's amax
        g_amax = whole_amax(g, *grad_tp)
    if grad_pending is not None:  # delayed: scale from the history
        g_amax = delayed_amax(grad_past, g_amax)
    return scale_from_amax(g_amax, E5M2, margin)


class Float8Linear(nn.Linear):
    """nn.Linear with fp8 GEMMs; the same parameters (names, shapes, dtypes) as the nn.Linear it replaces."""

    def __init__(
        self,
        in_features: int,
        out_features: int,
        bias: bool = True,
        device: torch.device | str | None = None,
        dtype: torch.dtype | None = None,
        *,
        recipe: str = "dynamic",
        history_len: int = 16,
        margin: int = 0,
    ) -> None:
        super().__init__(in_features, out_features, bias=bias, device=device, dtype=dtype)
        if recipe not in RECIPES:
            raise ValueError(f"Float8Linear: recipe {recipe!r} is not one of {', '.join(RECIPES)}")
        if recipe == "delayed" and history_len < 1:
            raise ValueError(f"Float8Linear: history_len={history_len} must be >= 1 for the delayed recipe")
        self.recipe, self.history_len, self.margin = recipe, history_len, margin
        self.history_ready = False  # synced or loaded a history: until then a tp rank agrees its current amaxes
        self.history_positive = False  # every history row > 0 at the last sync: the casts need no amax first
        if recipe == "delayed":
            self.register_amax_buffers(device)

    def register_amax_buffers(self, device: torch.device | str | None) -> None:
        """The delayed recipe's state: the history (checkpointed) and this step's amaxes (not: zero after a sync)."""
        self.register_buffer("amax_history", torch.zeros(3, self.history_len, device=device))
        self.register_buffer("amax_pending", torch.zeros(3, device=device), persistent=False)

    def _load_from_state_dict(self, state_dict, prefix, *args) -> None:
        super()._load_from_state_dict(state_dict, prefix, *args)
        self.history_ready = self.history_ready or f"{prefix}amax_history" in state_dict

    @classmethod
    def from_linear(cls, linear: nn.Linear, *, recipe: str, history_len: int, margin: int = 0) -> Float8Linear:
        """A Float8Linear that holds `linear`'s own Parameter objects (so optimizers and state_dicts see no change)."""
        with torch.device("meta"):
            new = cls(
                linear.in_features,
                linear.out_features,
                bias=linear.bias is not None,
                recipe=recipe,
                history_len=history_len,
                margin=margin,
            )
        new.weight = linear.weight
        new.bias = linear.bias
        if recipe == "delayed":
            new.register_amax_buffers(linear.weight.device)
        return new

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        device_type = x.device.type
        out_dtype = torch.get_autocast_dtype(device_type) if torch.is_autocast_enabled(device_type) else x.dtype
        weight, tp, shards = self.weight, None, None
        if isinstance(weight, DTensor):  # tensor parallel: the GEMMs on this rank's shards (module docstring)
            tp, w_placement, shards = weight.device_mesh, weight.placements[0], tp_shards(weight, x)
            grad_x = None if shards.grad_x is None else (shards.grad_x,)
            x, weight = x.to_local(grad_placements=grad_x), weight.to_local()
        if self.recipe == "rowwise":  # K sharded: forward's amaxes over tp (RowwiseParallel); N: backward's
            fwd, bwd = (None, None) if tp is None else tp_groups(tp, w_placement)
            y = rowwise_matmul(x, weight, out_dtype=out_dtype, margin=self.margin, fwd_group=fwd, bwd_group=bwd)
            return self._output(y, tp, shards)
        if self.recipe == "delayed" and self.history_positive:  # every scale from the history: one pass per cast
            history, pending = local(self.amax_history), local(self.amax_pending)
            past = history.amax(dim=1)  # (3,): input, weight, grad_output
            x_scale, w_scale = (scale_from_amax(past[i], E4M3, self.margin) for i in (INPUT, WEIGHT))
            records = (pending[INPUT : INPUT + 1], pending[WEIGHT : WEIGHT + 1])
            args = (x_scale, w_scale, past[GRAD_OUTPUT], pending[GRAD_OUTPUT:], out_dtype, self.margin, None)
            return self._output(_Fp8Matmul.apply(x, weight, *args, records, True), tp, shards)
        agree = tp is not None and (self.recipe == "dynamic" or not self.history_ready)
        x_amax, w_amax = amax(x), amax(weight)
        grad_past = grad_pending = grad_tp = None
        if self.recipe == "delayed":
            history, pending = local(self.amax_history), local(self.amax_pending)
            pending[:GRAD_OUTPUT].copy_(torch.maximum(pending[:GRAD_OUTPUT], torch.stack((x_amax, w_amax))))
        if agree:
            x_amax, w_amax = whole_amax(x, tp, shards.x), whole_amax(weight, tp, w_placement)
            grad_tp = (tp, shards.grad_y)
        if self.recipe == "delayed":
            past = history.amax(dim=1)  # (3,): input, weight, grad_output
            x_amax, w_amax = delayed_amax(past[INPUT], x_amax), delayed_amax(past[WEIGHT], w_amax)
            grad_past, grad_pending = past[GRAD_OUTPUT], pending[GRAD_OUTPUT:]
        x_scale = scale_from_amax(x_amax, E4M3, self.margin)
        w_scale = scale_from_amax(w_amax, E4M3, self.margin)
        args = (x_scale, w_scale, grad_past, grad_pending, out_dtype, self.margin, grad_tp, (None, None), False)
        return self._output(_Fp8Matmul.apply(x, weight, *args), tp, shards)

    def _output(self, y: torch.Tensor, tp: DeviceMesh | None, shards: Shards | None) -> torch.Tensor:
        if tp is not None:
            y = DTensor.from_local(y, tp, (shards.y,), run_check=False)
        return y if self.bias is None else y + self.bias.to(y.dtype)

    def extra_repr(self) -> str:
        history = f", history_len={self.history_len}" if self.recipe == "delayed" else ""
        return f"{super().extra_repr()}, recipe={self.recipe}{history}"


def tp_shards(weight: DTensor, x: torch.Tensor) -> Shards:
    """The placements of a weight sharded by torch's ColwiseParallel or RowwiseParallel, whose input is a DTensor."""
    shards = SHARDS.get(weight.placements[0]) if weight.device_mesh.ndim == 1 else None
    if shards is None or not isinstance(x, DTensor):
        raise ValueError(
            f"Float8Linear: weight placements {weight.placements} on a {weight.device_mesh.ndim}-D mesh with a "
            f"{type(x).__name__} input are neither ColwiseParallel's (Shard(0)) nor RowwiseParallel's (Shard(1)); "
            "shard the block with trainflow.parallel.tensor_parallel.apply_tp"
        )
    return shards


def tp_groups(mesh: DeviceMesh, w_placement: Placement) -> tuple[dist.ProcessGroup | None, dist.ProcessGroup | None]:
    """(forward's, backward's) group for the rowwise recipe's amaxes: the tp group where they reduce over a sharded
    dimension (K under RowwiseParallel, Shard(1); N under ColwiseParallel, Shard(0))."""
    group = mesh.get_group()
    return (group, None) if w_placement == Shard(1) else (None, group)


def delayed_layers(parts: list[nn.Module]) -> list[Float8Linear]:
    return [m for part in parts for m in part.modules() if isinstance(m, Float8Linear) and m.recipe == "delayed"]


def discard_amax(parts: list[nn.Module]) -> None:
    """Drop this step's amaxes without rolling them into the history: a step the loss guard did not apply (a spike's,
    a NaN's amax would scale every later step) leaves the history as it was. On every rank alike (the guard's
    verdict is agreed), with no collective."""
    for m in delayed_layers(parts):
        local(m.amax_pending).zero_()


def sync_amax_history(parts: list[nn.Module], *groups: dist.ProcessGroup | None) -> None:
    """Roll this step's amaxes into every delayed Float8Linear's history, all-reduced (MAX) over each group given,
    in ONE collective per group (None or none given: a single process). Call once per optimizer step on every rank:
    the data-parallel group (replicas of the same layers) and, under tensor parallel, the tp group (a shard's amax
    becomes the whole tensor's; a replicated tensor's amax is the same on every tp rank anyway)."""
    layers = delayed_layers(parts)
    if not layers:
        return
    pending = torch.stack([local(m.amax_pending) for m in layers])  # (layers, 3)
    for group in groups:
        if group is not None:
            dist.all_reduce(pending, op=dist.ReduceOp.MAX, group=group)
    for m, newest in zip(layers, pending):
        history = local(m.amax_history)
        history.copy_(torch.cat((newest[:, None], history[:, :-1]), dim=1))
        local(m.amax_pending).zero_()
        m.history_ready = True
    # One host read per step: which layers' histories give every scale (a row all zero needs the current amax).
    positive = (torch.stack([local(m.amax_history) for m in layers]).amax(dim=2) > 0).all(dim=1).tolist()
    for m, usable in zip(layers, positive):
        m.history_positive = usable
