"""The layout rules of hybrid parallelism, checked when a config is composed and again by ParallelDims
on the ranks that build the mesh.

    python -c "from trainflow.config.layout import parallel_errors as e; print(e(dp=2, tp=3, pp=1, \
        virtual_stages=1, schedule='1f1b', microbatches=1, n_layers=4, n_heads=4, ffn_dim=512, global_batch=16))"
"""

from __future__ import annotations

from trainflow.config.schema import SCHEDULES


def parallel_errors(
    *, dp: int, tp: int, pp: int, virtual_stages: int, schedule: str, microbatches: int,
    n_layers: int, n_heads: int, ffn_dim: int, global_batch: int,
) -> list[str]:
    """The layout rules of hybrid parallelism, one message per broken rule."""
    errors = []
    for name, value in (("dp", dp), ("tp", tp), ("pp", pp), ("virtual_stages", virtual_stages),
                        ("microbatches", microbatches)):
        if value < 1:
            errors.append(f"parallel.{name}({value}) must be >= 1")
    if errors:
        return errors
    if schedule not in SCHEDULES:
        errors.append(f"parallel.schedule({schedule!r}) must be one of {', '.join(SCHEDULES)}")
    if n_layers % (pp * virtual_stages):
        errors.append(
            f"model.n_layers({n_layers}) is not divisible by pp({pp}) * virtual_stages({virtual_stages}) "
            f"= {pp * virtual_stages} pipeline chunks"
        )
    if n_heads % tp:
        errors.append(f"model.n_heads({n_heads}) is not divisible by tp({tp}); choose tp dividing {n_heads}")
    if ffn_dim % tp:
        errors.append(f"model.ffn_dim({ffn_dim}) is not divisible by tp({tp})")
    if schedule == "interleaved_1f1b" and pp > 1 and virtual_stages < 2:
        errors.append(f"schedule interleaved_1f1b needs virtual_stages({virtual_stages}) >= 2")
    if schedule != "interleaved_1f1b" and virtual_stages != 1:
        errors.append(f"virtual_stages({virtual_stages}) > 1 needs schedule interleaved_1f1b, not {schedule}")
    if pp > 1 and schedule != "gpipe" and microbatches < pp:
        errors.append(f"schedule {schedule} needs microbatches({microbatches}) >= pp({pp})")
    if pp == 1 and microbatches != 1:
        errors.append(f"microbatches({microbatches}) > 1 needs pp > 1 (they feed the pipeline)")
    if global_batch % (dp * microbatches):
        errors.append(
            f"train.global_batch({global_batch}) is not divisible by dp({dp}) * microbatches({microbatches}) "
            f"= {dp * microbatches}"
        )
    return errors
