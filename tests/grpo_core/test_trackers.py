"""grpo_core/trainer/trackers.py: a tracker that is missing, unreachable or failing is a warning, never a failed run;
a resumed run in a fresh tracker directory gets the steps before its checkpoint; names and secrets are cleaned."""

from __future__ import annotations

import logging
import sys

import pytest

from grpo_core.config import TrackingInfo
from grpo_core.trainer import trackers
from grpo_core.trainer.trackers import Table, Trackers, mlflow_key, scrub


class Recorder:
    """A stand-in tracker that records its calls (and fails on ``fail_on``)."""

    name = "wandb"
    calls: list = []

    def __init__(self, info, root, run_name, config, fail_on: str = "") -> None:
        self.fail_on = fail_on
        Recorder.calls.append(("open", run_name, info.group, config))

    def log(self, step, metrics):
        if self.fail_on == "log":
            raise ConnectionError("server went away")
        Recorder.calls.append(("log", step, metrics))

    def log_table(self, step, key, table):
        Recorder.calls.append(("table", step, key, table.rows))

    def close(self):
        Recorder.calls.append(("close",))


@pytest.fixture
def recorder(monkeypatch):
    Recorder.calls = []
    monkeypatch.setitem(trackers.OPENERS, "wandb", Recorder)
    return Recorder


def test_a_tracker_not_installed_is_a_warning_and_the_others_still_log(tmp_path, monkeypatch, caplog, recorder):
    monkeypatch.setitem(sys.modules, "mlflow", None)  # "not installed"
    with caplog.at_level(logging.WARNING, logger="grpo_core.trainer.trackers"):
        t = Trackers(["jsonl", "mlflow", "wandb"], TrackingInfo(group="r", name="grpo_train"), tmp_path, {"beta": 0.1},
                     history=[])
    assert "mlflow but it is not installed" in caplog.text and ".[tracking]" in caplog.text
    t.log(1, {"loss": 0.5, "eval/pass@1": float("nan"), "note": "text"})
    t.close()
    assert recorder.calls == [("open", "grpo_train", "r", {"beta": 0.1}), ("log", 1, {"loss": 0.5}), ("close",)]


def test_a_tracker_that_cannot_start_or_fails_later_is_dropped_with_a_warning(tmp_path, monkeypatch, caplog):
    monkeypatch.setenv("WANDB_API_KEY", "sk-secret-value-31")

    def unreachable(*args, **kwargs):
        raise ConnectionError("could not reach https://api.wandb.ai with key sk-secret-value-31")

    monkeypatch.setitem(trackers.OPENERS, "wandb", unreachable)
    monkeypatch.setitem(trackers.OPENERS, "trackio", lambda *a: Recorder(*a, fail_on="log"))
    with caplog.at_level(logging.WARNING, logger="grpo_core.trainer.trackers"):
        t = Trackers(["wandb", "trackio"], TrackingInfo(), tmp_path / "out", {}, history=[])
        t.log(1, {"loss": 1.0})
        t.log(2, {"loss": 1.0})  # the failed tracker is gone: no second warning
        t.close()
    assert "could not start wandb (ConnectionError" in caplog.text
    assert "trackio failed (ConnectionError: server went away); dropped" in caplog.text
    assert caplog.text.count("server went away") == 1
    assert "sk-secret-value-31" not in caplog.text and "***" in caplog.text


def test_a_resumed_run_replays_the_checkpoint_history_into_a_fresh_tracker_dir_only(tmp_path, recorder):
    history = [{"step": 1, "loss": 1.0}, {"step": 2, "loss": 0.5}]
    Trackers(["wandb"], TrackingInfo(), tmp_path, {}, history).close()
    assert [c for c in recorder.calls if c[0] == "log"] == [("log", 1, {"loss": 1.0}), ("log", 2, {"loss": 0.5})]
    recorder.calls = []
    (tmp_path / "trackers" / "wandb").mkdir(parents=True)  # a shared directory that holds the run already
    t = Trackers(["wandb"], TrackingInfo(), tmp_path, {}, history)
    t.log_table(3, "completions", Table(["prompt", "completion"], [["1+1=", "2"]]))
    t.close()
    assert [c[0] for c in recorder.calls] == ["open", "table", "close"]


def test_metric_names_mlflow_accepts_and_secrets_scrubbed(monkeypatch):
    assert mlflow_key("eval/pass@1") == "eval/pass_at_1"
    assert mlflow_key("rewards/chain_accuracy/mean") == "rewards/chain_accuracy/mean"
    monkeypatch.setenv("MLFLOW_TRACKING_TOKEN", "tok-1234567")
    assert scrub("401 for token tok-1234567") == "401 for token ***"
