"""Reading back what the trackers wrote offline: a W&B offline run file, an MLflow file store, a Trackio database.

Each reader returns ``{"metrics": {step: {key: value}}, "config": {...}, "tables": {step: [row dicts]},
"meta": {...}}`` so a test compares the three the same way.
"""

from __future__ import annotations

import json
import sqlite3
import struct
from pathlib import Path
from typing import Any

WANDB_BLOCK = 32768  # the .wandb file is a LevelDB-style log: 7-byte header, records in 32 KiB blocks


def _wandb_records(path: Path) -> list[bytes]:
    data, out, buf, pos = path.read_bytes(), [], b"", 7  # 7: the ":W&B" + magic + version header
    while pos + 7 <= len(data):
        left = WANDB_BLOCK - pos % WANDB_BLOCK
        if left < 7:
            pos += left
            continue
        _crc, length, kind = struct.unpack("<IHB", data[pos:pos + 7])
        if length == 0 and kind == 0:  # block padding
            pos += left
            continue
        chunk, pos = data[pos + 7:pos + 7 + length], pos + 7 + length
        if kind == 1:  # full
            out.append(chunk)
        elif kind == 2:  # first
            buf = chunk
        elif kind == 3:  # middle
            buf += chunk
        elif kind == 4:  # last
            out.append(buf + chunk)
    return out


def read_wandb(root: Path) -> dict[str, Any]:
    """The one offline run under ``root`` (its ``run-*.wandb`` file and table JSON files)."""
    from wandb.proto import wandb_internal_pb2 as pb

    (path,) = sorted(Path(root).rglob("offline-run-*/run-*.wandb"))
    metrics: dict[int, dict[str, Any]] = {}
    tables: dict[int, list[dict[str, Any]]] = {}
    config: dict[str, Any] = {}
    meta: dict[str, Any] = {}
    for data in _wandb_records(path):
        record = pb.Record()
        record.ParseFromString(data)
        kind = record.WhichOneof("record_type")
        if kind == "run":
            meta = {"group": record.run.run_group, "name": record.run.display_name, "project": record.run.project}
            config.update({i.key: json.loads(i.value_json) for i in record.run.config.update})
        elif kind == "config":
            config.update({i.key: json.loads(i.value_json) for i in record.config.update})
        elif kind == "history":
            row = {i.key or "/".join(i.nested_key): json.loads(i.value_json) for i in record.history.item}
            step = int(row["_step"])
            metrics.setdefault(step, {}).update({k: v for k, v in row.items() if not k.startswith("_")})
            if "completions/path" in row:
                table = json.loads((path.parent / "files" / row["completions/path"]).read_text())
                tables[step] = [dict(zip(table["columns"], r)) for r in table["data"]]
    return {"metrics": metrics, "config": config, "tables": tables, "meta": meta}


def read_mlflow(store: Path, experiment: str, run_name: str) -> dict[str, Any]:
    """The run ``run_name`` of ``experiment`` in the MLflow file store at ``store``."""
    import os

    os.environ.setdefault("MLFLOW_ALLOW_FILE_STORE", "true")
    from mlflow import MlflowClient

    client = MlflowClient(tracking_uri=f"file:{Path(store).resolve()}")
    exp = client.get_experiment_by_name(experiment)
    (run,) = client.search_runs([exp.experiment_id], filter_string=f"tags.mlflow.runName = '{run_name}'")
    metrics: dict[int, dict[str, Any]] = {}
    for key in run.data.metrics:
        for m in client.get_metric_history(run.info.run_id, key):
            metrics.setdefault(m.step, {})[key] = m.value
    # the store records absolute artifact paths of where it was written; the committed copy has them beside the run
    artifacts = Path(store) / exp.experiment_id / run.info.run_id / "artifacts"
    tables = {}
    for path in sorted((artifacts / "completions").glob("step_*.json")):
        table = json.loads(path.read_text())
        tables[int(path.stem.split("_")[1])] = [dict(zip(table["columns"], r)) for r in table["data"]]
    return {"metrics": metrics, "config": json.loads((artifacts / "config.json").read_text()), "tables": tables,
            "meta": {**run.data.tags, "lineage": json.loads((artifacts / "lineage.json").read_text()),
                     "params": run.data.params}}


def read_trackio(db: Path, run_name: str) -> dict[str, Any]:
    """The run ``run_name`` in the Trackio project database ``db``."""
    con = sqlite3.connect(db)
    metrics: dict[int, dict[str, Any]] = {}
    tables: dict[int, list[dict[str, Any]]] = {}
    for step, blob in con.execute("select step, metrics from metrics where run_name = ? order by id", (run_name,)):
        row = json.loads(blob)
        for key, value in row.items():
            if isinstance(value, dict) and value.get("_type") == "trackio.table":
                tables[step] = value["_value"]
            else:
                metrics.setdefault(step, {})[key] = value
    (config,) = [json.loads(c) for (c,) in con.execute("select config from configs where run_name = ?", (run_name,))]
    return {"metrics": metrics, "config": config, "tables": tables, "meta": {}}
