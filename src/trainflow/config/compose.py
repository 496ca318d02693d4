"""Composing a stage's config with Hydra's compose API, and Hydra's errors as one line.

python -c "from trainflow.config import compose; print(compose('train_segment', ['model=tiny']))"
"""

from __future__ import annotations

import re
from pathlib import Path

from omegaconf import DictConfig, OmegaConf
from omegaconf.errors import OmegaConfBaseException

from trainflow.config.checks import validate
from trainflow.config.run_folder import fill_io
from trainflow.config.schema import TrainflowConfig
from trainflow.errors import ConfigError

# conf/ lives at the repository root; trainflow is installed editable (`pip install -e .`).
CONF_DIR = Path(__file__).resolve().parents[3] / "conf"


def compose(config_name: str, overrides: list[str] | tuple[str, ...] = ()) -> TrainflowConfig:
    """Compose a primary config with Hydra's compose API, resolve it and validate it."""
    from hydra import compose as hydra_compose
    from hydra import initialize_config_dir
    from hydra.core.global_hydra import GlobalHydra

    GlobalHydra.instance().clear()
    try:
        with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
            raw = hydra_compose(config_name=config_name, overrides=list(overrides))
    except Exception as err:  # Hydra's errors span lines; ours are one line with the fix
        raise ConfigError(one_line(err)) from err
    return to_config(raw)


def one_line(err: BaseException) -> str:
    """Hydra/OmegaConf composition errors as one line: the innermost cause names the key."""
    cause = err
    while cause.__cause__ is not None:
        cause = cause.__cause__
    text = str(cause)
    if m := re.search(r"Key '(.+?)' not in '(\w+)'\s+full_key: (\S+)", text):
        return (
            f"unknown config key '{m[3]}' ({m[2]} has no field '{m[1]}'): check its spelling in conf/ or "
            "src/trainflow/config/schema.py"
        )
    if m := re.search(
        r"Could not find '(.+?)'\s+Available options in '(.+?)':((?:\s+\S+)+?)\s+Config search path", text
    ):
        return f"no config option '{m[1]}': choose one of {', '.join(m[3].split())} for {m[2]}"
    if m := re.search(r"(Value .+?)\s+full_key: (\S+)", text):
        return f"bad value for '{m[2]}': {m[1]}"
    if m := re.search(r"full_key: (\S+)", text):
        return f"bad value for '{m[1]}': {text.splitlines()[0]}"
    return " ".join(text.split())


def to_config(raw: DictConfig) -> TrainflowConfig:
    """Resolve interpolations, turn the DictConfig into the dataclass tree, fill in the io paths left
    empty and validate it."""
    raw = OmegaConf.masked_copy(raw, [k for k in raw if k != "hydra"]) if "hydra" in raw else raw
    try:
        OmegaConf.resolve(raw)
        cfg = OmegaConf.to_object(raw)
    except OmegaConfBaseException as err:  # an interpolation that resolves to a wrong type or nothing
        raise ConfigError(one_line(err)) from err
    assert isinstance(cfg, TrainflowConfig)
    fill_io(cfg)
    validate(cfg)
    return cfg
