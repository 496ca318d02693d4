"""trainflow's configuration: the schema (schema, cluster, paths, faults, domain), the model's shape (shape), the stage
table (stages), its checks (checks, layout), composition with Hydra (compose, overrides), the run folder's paths
(run_folder) and what reruns what (hashing). Nothing here imports torch.

    python -c "from trainflow.config import compose; print(compose('train_segment', ['model=tiny']))"
"""

from trainflow.config.checks import validate
from trainflow.config.cluster import AllocationConfig, ClusterConfig, GateConfig, HardwareConfig, RuntimeConfig
from trainflow.config.compose import CONF_DIR, compose, one_line, to_config
from trainflow.config.domain import RUN_NAME, Domain
from trainflow.config.energy import EnergyConfig
from trainflow.config.faults import FaultConfig
from trainflow.config.hashing import as_dict, config_hash, stage_hash
from trainflow.config.layout import ParallelDims, parallel_errors
from trainflow.config.paths import IOConfig, StorageConfig
from trainflow.config.schema import (
    BYTE_VOCAB,
    SCHEDULES,
    CheckpointConfig,
    DataConfig,
    ModelConfig,
    OptimConfig,
    ParallelConfig,
    TrainConfig,
    TrainflowConfig,
)
from trainflow.config.stages import ALLOCATING, STAGE_READS, STAGE_TABLE, STAGES
from trainflow.errors import ConfigError, TrainflowError

__all__ = [
    "ALLOCATING",
    "BYTE_VOCAB",
    "CONF_DIR",
    "RUN_NAME",
    "SCHEDULES",
    "STAGES",
    "STAGE_READS",
    "STAGE_TABLE",
    "AllocationConfig",
    "CheckpointConfig",
    "ClusterConfig",
    "ConfigError",
    "DataConfig",
    "Domain",
    "EnergyConfig",
    "FaultConfig",
    "GateConfig",
    "HardwareConfig",
    "IOConfig",
    "ModelConfig",
    "OptimConfig",
    "ParallelConfig",
    "ParallelDims",
    "RuntimeConfig",
    "StorageConfig",
    "TrainConfig",
    "TrainflowConfig",
    "TrainflowError",
    "as_dict",
    "compose",
    "config_hash",
    "one_line",
    "parallel_errors",
    "stage_hash",
    "to_config",
    "validate",
]
