"""``r1 run -c configs/ci-tiny.yaml`` with ``report_to: [jsonl, wandb, mlflow, trackio]`` offline on both GRPO stages:
each tracker's files, committed with the stage as ``trackers/``, hold the GRPO metrics (held-out ``eval/...`` at the
``eval_steps`` steps included), the resolved config with the stage lineage, and the completion table; no credential
reaches the store or the log."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml
from typer.testing import CliRunner

from flows.cli import app
from tasks.storage.store import Store
from tests.tracker_files import read_mlflow, read_trackio, read_wandb

ROOT = Path(__file__).resolve().parents[2]
RUN = "trk"
SECRET = "wandb-secret-never-logged-31"
TRACKED = {"report_to": ["jsonl", "wandb", "mlflow", "trackio"], "log_completions_steps": 2, "eval_steps": 2,
           "eval_samples": 4}


@pytest.mark.slow
def test_ci_tiny_run_logs_metrics_config_and_completions_to_every_tracker(tmp_path, monkeypatch):
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_API_KEY", SECRET)
    for name in ("MLFLOW_TRACKING_URI", "TRACKIO_DIR", "WANDB_DIR", "WANDB_PROJECT"):
        monkeypatch.delenv(name, raising=False)
    config = yaml.safe_load((ROOT / "configs" / "ci-tiny.yaml").read_text())
    for section in ("grpo_train", "final_rl"):
        config[section].update(TRACKED)
    path = tmp_path / "ci-tiny-tracked.yaml"
    path.write_text(yaml.safe_dump(config))
    store = tmp_path / "store"
    result = CliRunner().invoke(app, ["run", "-c", str(path), "--run", RUN, "--store", str(store)])
    assert result.exit_code == 0, result.output

    st = Store(str(store))
    ref = st.latest(RUN, "grpo_train")
    jsonl = [json.loads(line) for line in st.read_output(ref, "metrics.jsonl").decode().splitlines()]
    assert [row["step"] for row in jsonl] == [1, 2, 3, 4]
    assert [("eval/accuracy" in row, "eval/pass@1" in row) for row in jsonl] == [(False, False), (True, True)] * 2
    completions = [json.loads(line) for line in st.read_output(ref, "completions.jsonl").decode().splitlines()]
    assert sorted({row["step"] for row in completions}) == [2, 4] and len(completions) == 2 * 8  # 8 completions a step

    out = store / ref.path / "trackers"
    runs = {"wandb": read_wandb(out / "wandb"), "mlflow": read_mlflow(out / "mlflow", RUN, "grpo_train"),
            "trackio": read_trackio(out / "trackio" / f"{RUN}.db", "grpo_train")}
    lineage = {"run": RUN, "stage": "grpo_train", "version": ref.version, "fingerprint": ref.fingerprint}
    for name, got in runs.items():
        assert sorted(got["metrics"]) == [1, 2, 3, 4], name
        for row in jsonl:
            logged = got["metrics"][row["step"]]
            for key in ("loss", "reward", "rewards/chain_accuracy/mean", "completions/reflection_rate") + (
                    ("eval/accuracy", "eval/pass@1", "eval/reflection_rate") if "eval/accuracy" in row else ()):
                mlflow_key = key.replace("@", "_at_") if name == "mlflow" else key
                assert logged[mlflow_key] == pytest.approx(row[key]), (name, row["step"], key)
        assert got["config"]["learning_rate"] == 5e-5 and got["config"]["eval_steps"] == 2, name
        meta = got["meta"]["lineage"] if name == "mlflow" else got["config"]["lineage"]
        assert {k: meta[k] for k in lineage} == lineage, name
        assert meta["parents"]["prepare_data"]["version"] == st.latest(RUN, "prepare_data").version, name
        assert sorted(got["tables"]) == [2, 4], name
        table = got["tables"][4]
        assert len(table) == 8 and {"prompt", "completion", "reward/chain_accuracy", "reward", "source"} <= set(table[0])
        assert [r["completion"] for r in table] == [r["completion"] for r in completions if r["step"] == 4], name
    assert runs["wandb"]["meta"]["group"] == RUN and runs["wandb"]["meta"]["name"] == "grpo_train"

    final = st.latest(RUN, "final_rl")  # the second GRPO stage: its own tracker runs, in the same group
    final_out = store / final.path / "trackers"
    assert read_wandb(final_out / "wandb")["meta"]["group"] == RUN
    assert read_mlflow(final_out / "mlflow", RUN, "final_rl")["meta"]["lineage"]["stage"] == "final_rl"
    assert sorted(read_trackio(final_out / "trackio" / f"{RUN}.db", "final_rl")["tables"]) == [2]  # max_steps 2

    leaked = [str(p) for p in store.rglob("*") if p.is_file() and SECRET.encode() in p.read_bytes()]
    assert not leaked and SECRET not in result.output
