"""The experiment trackers a segment's metrics go to besides TensorBoard (cfg.observe.wandb, cfg.observe.mlflow;
trainflow.train.trackers writes them).

    python -m trainflow.stages.train_segment observe.wandb.enabled=true observe.mlflow.enabled=true

A tracking URI is checked here as text (its scheme, host and port: `mlflow_errors`); whether its package imports and
its server answers is the machine's, checked before a job is submitted (trainflow.preflight.tracker_errors). Once
training runs, the bounds below hold every request a tracker makes (trainflow.train.trackers.Guarded).
"""

from __future__ import annotations

from dataclasses import dataclass
from urllib.parse import urlsplit

from trainflow.config.domain import checked

TRACKER_NAME = r"[A-Za-z0-9_][A-Za-z0-9_.-]*"
URI = r"([a-z][a-z0-9+.-]*://[^\s'\"`$;|&<>]*)?"
SERVER_SCHEMES = {"http": 80, "https": 443, "postgresql": 5432, "mysql": 3306, "mssql": 1433}
"""MLflow tracking URIs of a server (its default port): a host to reach, a port in 1-65535."""
FILE_SCHEMES = ("sqlite", "file")
"""MLflow tracking URIs of a store on a file system: a path to write."""
URI_FIX = "give a tracking URI such as http://mlflow.example:5000 or sqlite:///path.db, or leave it empty"

REQUEST_S = 5
"""The longest one request of a tracker to its server waits (W&B's and MLflow's own: 90 s and 120 s)."""
RETRIES = 2
"""Retries of a failed request (MLflow's own: 7, with a backoff that grows to minutes)."""
STALL_S = 20
"""The longest a failing tracker holds rank 0 in one call: (RETRIES + 1) x REQUEST_S and MLflow's backoff of 1 + 2 s,
or W&B's bounded start (trainflow.train.wandb_log); a tracker that fails once logs nothing more in that job."""


@dataclass
class WandbConfig:
    """Weights & Biases: one W&B run per checkpoint series, its id the series' name (config.identity), resumed by every
    segment, restart and change of settings; its files under the run's train folder (RunFolder.wandb)."""

    enabled: bool = False
    project: str = checked("trainflow", pattern=TRACKER_NAME, fix="letters, digits, _ . - and no leading dot")
    entity: str = checked("", pattern=f"({TRACKER_NAME})?", fix="a W&B team or user name, or empty for your default")
    mode: str = checked("offline", one_of=("offline", "online"))
    """offline (the default; compute nodes rarely reach the internet): `wandb sync <its folder>` uploads it later."""


@dataclass
class MlflowConfig:
    """MLflow: one MLflow run per checkpoint series in `experiment`, found again by its tag trainflow.train_hash (the
    series' name: the tag kept its first name, so runs logged before series stay found), resumed by every segment,
    restart and change of settings."""

    enabled: bool = False
    uri: str = checked("", pattern=URI, fix=URI_FIX)
    """The tracking URI: http(s):// a tracking server, postgresql:// mysql:// mssql:// a database, sqlite:/// or
    file:// a local store; empty: a SQLite store in the run folder (RunFolder.mlflow_store)."""
    experiment: str = checked("trainflow", pattern=TRACKER_NAME, fix="letters, digits, _ . - and no leading dot")


def observe_errors(w: WandbConfig, m: MlflowConfig, *, collective_timeout_s: float, hang_detect_s: float) -> list[str]:
    """A tracking URI that is one, and a collective timeout and hang threshold that outlast a failing tracker's stall
    on rank 0 (the other ranks wait for it in their next collective; its own main thread makes no progress)."""
    remote = [f"observe.mlflow.uri={m.uri}"] if m.enabled and urlsplit(m.uri).scheme in SERVER_SCHEMES else []
    remote += ["observe.wandb.mode=online"] if w.enabled and w.mode == "online" else []
    errors = mlflow_errors(m)
    limits = {"cluster.runtime.collective_timeout_s": collective_timeout_s, "resilience.hang_detect_s": hang_detect_s}
    errors += [
        f"{key}({seconds:g}) <= {STALL_S} s, the longest a failing tracker ({remote[0]}) may hold rank 0 in one call: "
        f"raise it above {STALL_S} s or turn the tracker off"
        for key, seconds in limits.items()
        if remote and 0 < seconds <= STALL_S
    ]
    return errors


def mlflow_errors(m: MlflowConfig) -> list[str]:
    """observe.mlflow.uri's scheme, host and port (its characters are its domain's)."""
    if not m.uri:
        return []
    head = f"observe.mlflow.uri({m.uri!r})"
    parts = urlsplit(m.uri)
    if parts.scheme not in (*SERVER_SCHEMES, *FILE_SCHEMES):
        schemes = ", ".join(f"{s}://" for s in (*SERVER_SCHEMES, *FILE_SCHEMES))
        return [f"{head} has the scheme {parts.scheme}://, which MLflow does not track to: use {schemes}"]
    try:
        port = parts.port
    except ValueError:  # urllib's words: "Port out of range 0-65535", "Port could not be cast to integer value"
        port = 0
    if port == 0 or parts.netloc.endswith(":"):
        return [f"{head} has a port that is no number in 1-65535; {URI_FIX}"]
    if parts.scheme in SERVER_SCHEMES and not parts.hostname:
        return [f"{head} names no host; {URI_FIX}"]
    if parts.scheme in FILE_SCHEMES and not parts.path.strip("/"):
        return [f"{head} names no file; {URI_FIX}"]
    return []
