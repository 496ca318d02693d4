"""trainflow's configuration: the schema (schema), its checks (checks, layout), composition with Hydra
(compose, overrides) and what reruns what (hashing). Nothing here imports torch.

    python -c "from trainflow.config import compose; print(compose('train_segment', ['model=tiny']))"
"""

from trainflow.config.checks import validate
from trainflow.config.compose import CONF_DIR, compose, one_line, to_config
from trainflow.config.hashing import as_dict, config_hash, stage_hash
from trainflow.config.layout import ParallelDims, parallel_errors
from trainflow.config.schema import (
    BYTE_VOCAB,
    RUN_NAME,
    SCHEDULES,
    CheckpointConfig,
    ClusterConfig,
    DataConfig,
    Domain,
    EnergyConfig,
    FaultConfig,
    IOConfig,
    ModelConfig,
    OptimConfig,
    ParallelConfig,
    StorageConfig,
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
    "STAGE_READS",
    "STAGES",
    "STAGE_TABLE",
    "CheckpointConfig",
    "ClusterConfig",
    "ConfigError",
    "DataConfig",
    "Domain",
    "EnergyConfig",
    "FaultConfig",
    "IOConfig",
    "ModelConfig",
    "OptimConfig",
    "ParallelConfig",
    "ParallelDims",
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
