"""ParallelDims: the validated layout (dp x tp x pp, virtual stages, microbatches) and its mesh.

    python -c "from trainflow.parallel.dims import ParallelDims as P; P(dp=64, tp=8, pp=8, world_size=4096)"
"""

from __future__ import annotations

from dataclasses import dataclass

from trainflow.config import ConfigError, ParallelConfig, parallel_errors


@dataclass(frozen=True)
class ParallelDims:
    dp: int
    tp: int
    pp: int
    world_size: int
    virtual_stages: int = 1
    schedule: str = "1f1b"
    microbatches: int = 1

    def __post_init__(self) -> None:
        if self.dp * self.tp * self.pp != self.world_size:
            raise ConfigError(
                f"dp({self.dp}) * tp({self.tp}) * pp({self.pp}) = {self.dp * self.tp * self.pp} "
                f"!= world_size({self.world_size}); change the layout or the number of ranks"
            )

    @classmethod
    def from_config(cls, p: ParallelConfig, *, world_size: int, n_layers: int, n_heads: int, ffn_dim: int,
                    global_batch: int) -> "ParallelDims":
        errors = parallel_errors(
            dp=p.dp, tp=p.tp, pp=p.pp, virtual_stages=p.virtual_stages, schedule=p.schedule,
            microbatches=p.microbatches, n_layers=n_layers, n_heads=n_heads, ffn_dim=ffn_dim, global_batch=global_batch,
        )
        if errors:
            raise ConfigError("invalid parallel layout: " + "; ".join(errors))
        return cls(dp=p.dp, tp=p.tp, pp=p.pp, world_size=world_size, virtual_stages=p.virtual_stages,
                   schedule=p.schedule, microbatches=p.microbatches)

    @property
    def n_stages(self) -> int:
        return self.pp * self.virtual_stages

    def build_mesh(self, device_type: str):
        """One named mesh, outermost first: pp (slowest links), dp, tp (inside a node's NVLink)."""
        from torch.distributed.device_mesh import init_device_mesh

        return init_device_mesh(device_type, (self.pp, self.dp, self.tp), mesh_dim_names=("pp", "dp", "tp"))
