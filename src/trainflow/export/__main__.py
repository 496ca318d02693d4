"""python -m trainflow.export CHECKPOINT OUT [--max-shard-gb 5] [OVERRIDE ...]: see trainflow.export."""

from __future__ import annotations

import argparse
import logging.config
import sys
from pathlib import Path

import yaml

from trainflow.arguments import positive
from trainflow.config import CONF_DIR, TrainflowError, compose
from trainflow.export import __doc__ as DOC
from trainflow.export import export, log
from trainflow.hf.write import MAX_SHARD_BYTES


def main(argv: list[str] | None = None) -> None:
    logging.config.dictConfig(yaml.safe_load((CONF_DIR / "hydra/job_logging/trainflow.yaml").read_text()))
    parser = argparse.ArgumentParser(prog="python -m trainflow.export", description=DOC.splitlines()[0])
    parser.add_argument("checkpoint", type=Path, help="a checkpoint (step-N/) or a series of them")
    parser.add_argument("out", type=Path, help="the Hugging Face folder to write (new or empty)")
    parser.add_argument(
        "--max-shard-gb",
        type=positive("--max-shard-gb", "GB", "5"),
        default=MAX_SHARD_BYTES / 1e9,
        help="largest safetensors file (GB, > 0)",
    )
    parser.add_argument("overrides", nargs="*", help="the run's Hydra overrides, e.g. model=tiny (optional)")
    args = parser.parse_args(argv)
    try:
        given = compose("train_segment", args.overrides).model if args.overrides else None
        export(args.checkpoint, args.out, given, max_shard_bytes=int(args.max_shard_gb * 1e9))
    except TrainflowError as err:
        log.error("%s: %s", type(err).__name__, err)
        sys.exit(1)


if __name__ == "__main__":
    main()
