"""Experiment trackers of ``report_to`` beyond the JSON lines and TensorBoard: W&B, MLflow and Trackio.

One tracker run per training call (a pipeline stage), grouped by the pipeline run: W&B ``group`` (project
``TrackingInfo.project`` or ``WANDB_PROJECT``), MLflow experiment = the pipeline run with one run per stage,
Trackio project = the pipeline run. Each run gets every logged metric at its step, the resolved trainer config
and the lineage (``TrackingInfo.metadata``: run, stage, version, fingerprint, parents) as its metadata, and the
completion tables ``log_completions_steps`` asks for.

Files go under ``TrackingInfo.dir`` (default ``output_dir/trackers``): ``wandb/`` (W&B writes offline there when
``WANDB_MODE=offline`` or no ``WANDB_API_KEY`` is set; ``wandb sync`` uploads later), ``mlflow/`` (the MLflow
file store, unless ``MLFLOW_TRACKING_URI`` names a server) and ``trackio/`` (Trackio's local database, unless
``TRACKIO_DIR`` is set). A tracker that is not installed, cannot be reached or fails later is a warning and is
dropped; the run goes on. Credentials are read by the trackers' own packages from the environment and never
written by this module; an error message is scrubbed of their values before it is logged.

On resume a tracker run opened in a fresh directory first receives the resumed history (the rows up to the
checkpoint), so it holds every step; one reopened in a shared directory (``TrackingInfo.dir`` set) continues
its run (W&B id / MLflow tag / Trackio name), where steps after the last checkpoint may appear twice.

The tracker packages are imported only when named (the ``tracking`` extra); Trackio itself imports fsspec,
which grpo_core never does.
"""

from __future__ import annotations

import json
import logging
import math
import os
import re
import sys
import time
from pathlib import Path
from typing import Any, Callable

from grpo_core.config import TrackingInfo

logger = logging.getLogger(__name__)

TRACKERS = ("wandb", "mlflow", "trackio")
SECRET_ENV = ("WANDB_API_KEY", "MLFLOW_TRACKING_TOKEN", "MLFLOW_TRACKING_PASSWORD", "HF_TOKEN",
              "HUGGING_FACE_HUB_TOKEN", "AWS_SECRET_ACCESS_KEY")
INSTALL_HINT = "pip install -e '.[tracking]'"


def scrub(text: str) -> str:
    """``text`` with the values of credential variables (``SECRET_ENV``) replaced by ``***``."""
    for name in SECRET_ENV:
        value = os.environ.get(name)
        if value and len(value) >= 4:
            text = text.replace(value, "***")
    return text


def numeric(metrics: dict[str, Any]) -> dict[str, float]:
    """The finite numbers of ``metrics`` (booleans as 0/1), as floats."""
    out = {}
    for key, value in metrics.items():
        if hasattr(value, "item"):
            value = value.item()
        if isinstance(value, (int, float)) and math.isfinite(value):
            out[key] = float(value)
    return out


class Table:
    """A completion table: column names and rows of plain values."""

    def __init__(self, columns: list[str], rows: list[list[Any]]) -> None:
        self.columns, self.rows = columns, rows

    def as_dict(self) -> dict[str, list[Any]]:
        return {c: [r[i] for r in self.rows] for i, c in enumerate(self.columns)}


class WandbTracker:
    def __init__(self, info: TrackingInfo, root: Path, run_name: str, config: dict[str, Any]) -> None:
        import wandb

        mode = os.environ.get("WANDB_MODE") or ("online" if os.environ.get("WANDB_API_KEY") else "offline")
        root.mkdir(parents=True, exist_ok=True)
        self.wandb = wandb
        self.run = wandb.init(
            project=os.environ.get("WANDB_PROJECT") or info.project, group=info.group, name=run_name,
            id=re.sub(r"[^A-Za-z0-9_-]", "-", info.run_key)[:64] if info.run_key else None, resume="allow",
            dir=str(root), mode=mode, config={**config, "lineage": info.metadata}, job_type=run_name,
            settings=wandb.Settings(silent=True, console="off", x_disable_stats=True))

    def log(self, step: int, metrics: dict[str, float]) -> None:
        self.run.log(metrics, step=step)

    def log_table(self, step: int, key: str, table: Table) -> None:
        self.run.log({key: self.wandb.Table(columns=table.columns, data=table.rows)}, step=step)

    def close(self) -> None:
        self.run.finish()


MLFLOW_NAME = re.compile(r"[^A-Za-z0-9_\-. :/]")


class MlflowTracker:
    """MLflow through ``MlflowClient`` (no global active run): experiment = the pipeline run, a run per stage."""

    def __init__(self, info: TrackingInfo, root: Path, run_name: str, config: dict[str, Any]) -> None:
        from mlflow import MlflowClient
        from mlflow.entities import Param

        uri = os.environ.get("MLFLOW_TRACKING_URI") or f"file:{root.resolve()}"
        if uri.startswith("file:"):  # MLflow 3 keeps the file store behind this switch; tests and offline use it
            os.environ.setdefault("MLFLOW_ALLOW_FILE_STORE", "true")
        self.client = client = MlflowClient(tracking_uri=uri)
        name = info.group or info.project
        experiment = client.get_experiment_by_name(name)
        experiment_id = experiment.experiment_id if experiment else client.create_experiment(name)
        found = []
        if info.run_key:
            found = client.search_runs([experiment_id], filter_string=f"tags.`r1.run_key` = '{info.run_key}'")
        tags = {"r1.run_key": info.run_key or "", **{f"r1.{k}": _short(v) for k, v in info.metadata.items()}}
        self.run_id = found[0].info.run_id if found else client.create_run(experiment_id, run_name=run_name,
                                                                         tags=tags).info.run_id
        params = [Param(k, _short(v)) for k, v in flatten(config).items()]
        if not found:  # params are write-once: a retry's are the same (same fingerprint)
            for i in range(0, len(params), 100):
                client.log_batch(self.run_id, params=params[i:i + 100])
        client.log_dict(self.run_id, config, "config.json")
        client.log_dict(self.run_id, info.metadata, "lineage.json")

    def log(self, step: int, metrics: dict[str, float]) -> None:
        from mlflow.entities import Metric

        now = int(time.time() * 1000)
        batch = [Metric(mlflow_key(k), v, now, step) for k, v in metrics.items()]
        for i in range(0, len(batch), 1000):
            self.client.log_batch(self.run_id, metrics=batch[i:i + 1000])

    def log_table(self, step: int, key: str, table: Table) -> None:
        self.client.log_table(self.run_id, data=table.as_dict(), artifact_file=f"{key}/step_{step:06d}.json")

    def close(self) -> None:
        self.client.set_terminated(self.run_id)


def mlflow_key(key: str) -> str:
    """A metric name MLflow accepts: ``eval/pass@1`` -> ``eval/pass_at_1``, other odd characters -> ``_``."""
    return MLFLOW_NAME.sub("_", key.replace("@", "_at_"))


_OWN_TRACKIO_DIR: str | None = None  # the TRACKIO_DIR this module set (a user's own setting wins over ours)


class TrackioTracker:
    """Trackio, local by default. Trackio reads its directory once per process (``TRACKIO_DIR`` at import); a
    later call in the same process points its storage at this call's directory."""

    def __init__(self, info: TrackingInfo, root: Path, run_name: str, config: dict[str, Any]) -> None:
        global _OWN_TRACKIO_DIR
        user_dir = os.environ.get("TRACKIO_DIR")
        root = Path(user_dir) if user_dir and user_dir != _OWN_TRACKIO_DIR else root
        root.mkdir(parents=True, exist_ok=True)
        if "trackio" not in sys.modules:  # read once, at import
            os.environ["TRACKIO_DIR"] = _OWN_TRACKIO_DIR = str(root)
        import trackio

        for module in (sys.modules.get("trackio.utils"), sys.modules.get("trackio.sqlite_storage"), trackio):
            if module is not None and hasattr(module, "TRACKIO_DIR"):
                module.TRACKIO_DIR = root
        self.trackio = trackio
        self.run = trackio.init(project=info.group or info.project, name=run_name, group=info.group,
                                config={**config, "lineage": info.metadata}, resume="allow", embed=False,
                                auto_log_gpu=False, auto_log_cpu=False)

    def log(self, step: int, metrics: dict[str, float]) -> None:
        self.run.log(metrics, step=step)

    def log_table(self, step: int, key: str, table: Table) -> None:
        self.run.log({key: self.trackio.Table(columns=table.columns, data=table.rows)}, step=step)

    def close(self) -> None:
        self.run.finish()


OPENERS: dict[str, Callable[..., Any]] = {"wandb": WandbTracker, "mlflow": MlflowTracker, "trackio": TrackioTracker}


def flatten(config: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    """``{"sampling": {"top_p": 1}}`` -> ``{"sampling.top_p": 1}``; lists stay whole (as JSON)."""
    out: dict[str, Any] = {}
    for key, value in config.items():
        if isinstance(value, dict) and value:
            out.update(flatten(value, f"{prefix}{key}."))
        else:
            out[f"{prefix}{key}"] = value
    return out


def _short(value: Any, limit: int = 500) -> str:
    text = value if isinstance(value, str) else json.dumps(value, default=str)
    return text[:limit]


class Trackers:
    """The open trackers of ``report_to``; each call goes to every one, and one that fails is warned about once
    and dropped."""

    def __init__(self, report_to: list[str], info: TrackingInfo, output_dir: Path, config: dict[str, Any],
                 history: list[dict[str, Any]]) -> None:
        root = Path(info.dir) if info.dir else output_dir / "trackers"
        run_name = info.name or output_dir.name
        self.open: list[tuple[str, Any]] = []
        for name in (n for n in report_to if n in OPENERS):
            fresh = not (root / name).exists()
            try:
                tracker = OPENERS[name](info, root / name, run_name, config)
            except ImportError as e:
                logger.warning("report_to names %s but it is not installed (%s): %s; metrics still go to the "
                               "others", name, scrub(str(e)), INSTALL_HINT)
                continue
            except Exception as e:  # noqa: BLE001 - an unreachable tracker must not fail the run
                logger.warning("report_to: could not start %s (%s: %s); training goes on without it", name,
                               type(e).__name__, scrub(str(e)))
                continue
            self.open.append((name, tracker))
            if fresh and history:  # a resumed run in a fresh directory: the steps before the checkpoint first
                self._call(name, tracker, lambda t: [t.log(row["step"], numeric({k: v for k, v in row.items()
                                                                                 if k != "step"})) for row in history])

    def _call(self, name: str, tracker: Any, fn: Callable[[Any], Any]) -> None:
        try:
            fn(tracker)
        except Exception as e:  # noqa: BLE001 - a tracker failing mid-run is dropped, not fatal
            logger.warning("report_to: %s failed (%s: %s); dropped for the rest of the run", name,
                           type(e).__name__, scrub(str(e)))
            self.open.remove((name, tracker))

    def log(self, step: int, metrics: dict[str, Any]) -> None:
        values = numeric(metrics)
        for name, tracker in list(self.open):
            self._call(name, tracker, lambda t: t.log(step, values))

    def log_table(self, step: int, key: str, table: Table) -> None:
        for name, tracker in list(self.open):
            self._call(name, tracker, lambda t: t.log_table(step, key, table))

    def close(self) -> None:
        for name, tracker in list(self.open):
            self._call(name, tracker, lambda t: t.close())
        self.open = []
