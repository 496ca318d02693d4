"""The checks of a composed config, in order: every field's domain (its `checked(...)` in the schema), the security
allow-lists (config.security) and validate_nccl's tables; then, those holding, the layout (config.layout) and the
cross-field rules (config.rules). Whether the machine can run the config is trainflow.preflight's.

    python -c "from trainflow.config import compose; compose('train_segment', ['optim.lr=-1'])"

`validate` raises one ConfigError whose message names every offending value and the fix.
"""

from __future__ import annotations

from dataclasses import fields, is_dataclass
from typing import Any

from trainflow.config.layout import parallel_errors
from trainflow.config.rules import rule_errors, table_errors
from trainflow.config.schema import TrainflowConfig
from trainflow.config.security import security_errors
from trainflow.errors import ConfigError


def validate(cfg: TrainflowConfig) -> None:
    """Raise one ConfigError listing every violation with its fix."""
    errors = domain_errors(cfg) + security_errors(cfg) + table_errors(cfg.cluster)
    if errors:  # the rules below assume every field lies in its domain
        raise ConfigError("invalid config: " + "; ".join(errors))
    p = cfg.parallel
    errors = parallel_errors(p, cfg.model, global_batch=cfg.train.global_batch) + rule_errors(cfg)
    if errors:
        raise ConfigError("invalid config: " + "; ".join(errors))


def domain_errors(node: Any, prefix: str = "") -> list[str]:
    """Every field of the dataclass tree outside its Domain, as `key(value) must ...`."""
    errors = []
    for f in fields(node):
        value, key = getattr(node, f.name), prefix + f.name
        if is_dataclass(value):
            errors += domain_errors(value, key + ".")
        elif isinstance(value, list) and value and is_dataclass(value[0]):  # data.sources
            errors += [e for i, item in enumerate(value) for e in domain_errors(item, f"{key}[{i}].")]
        elif domain := f.metadata.get("domain"):
            why = next(filter(None, map(domain.violation, value if isinstance(value, list) else [value])), None)
            if why:
                errors.append(f"{key}({value!r}) {why}")
    return errors
