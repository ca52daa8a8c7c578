"""The reward-hacking monitor in the pipeline (tasks/runner/monitor.py): the alarm as a Prefect event on the run's stage, the
best checkpoint kept by store pruning and fetched on resume, and the lines ``r1 status`` and the report show."""

from __future__ import annotations

import json
import logging
from pathlib import Path

from tasks.runner.monitor import ALARM_EVENT, publish_alarm, status_lines
from tasks.storage.store import Store

ALARM = {"event": "alarm", "source": "unsafe", "first_step": 20, "step": 40, "proxy_first": 3.1, "proxy_last": 4.998,
         "heldout_first": 0.6, "heldout_last": 0.0}


def test_an_alarm_is_a_warning_and_a_prefect_event_on_the_runs_stage(monkeypatch, caplog):
    import prefect.events

    emitted = []
    monkeypatch.setattr(prefect.events, "emit_event", lambda event, **kw: emitted.append((event, kw)))
    with caplog.at_level(logging.WARNING):
        publish_alarm("r7", "final_rl", ALARM, logging.getLogger("t"))
    [(name, kw)] = emitted
    assert name == ALARM_EVENT == "r1.reward_hacking.alarm"
    assert kw["resource"]["prefect.resource.id"] == "r1.run.r7.final_rl" and kw["resource"]["r1.stage"] == "final_rl"
    assert kw["payload"]["source"] == "unsafe" and kw["payload"]["heldout_last"] == 0.0 and "event" not in kw["payload"]
    assert "from step 20 to step 40" in caplog.text and "3.1 -> 4.998" in caplog.text and "0.6 -> 0" in caplog.text


def test_worker_relays_the_trainers_alarm_to_the_stage_task():
    from tasks.runner.worker import StoreCheckpoints

    events = []
    StoreCheckpoints(None, "r", "final_rl", "k", 1, events.append).on_alarm(dict(ALARM, event=None))
    assert events == [{**ALARM, "event": "alarm"}]


def _checkpoint(root: Path, step: int, best: int | None) -> Path:
    path = root / f"checkpoint-{step}"
    path.mkdir(parents=True)
    state = {"step": step, **({"best_checkpoint": {"step": best, "heldout": 1.0}} if best else {})}
    (path / "trainer_state.json").write_text(json.dumps(state))
    return path


def test_store_keeps_and_resume_fetches_the_checkpoint_select_checkpoint_would_commit(tmp_path):
    from tasks.runner.worker import StoreCheckpoints, fetch_checkpoint
    from tasks.config.training_spec import TrainingSpec

    store = Store(tmp_path / "store")
    events = []
    upload = StoreCheckpoints(store, "r", "final_rl", "k", 1, events.append)
    for step in (2, 4, 6):  # step 2 stays the best: keep 1 would otherwise leave only checkpoint-6
        upload.on_checkpoint(step, _checkpoint(tmp_path / "local", step, best=2))
    assert store.checkpoint_uri("r", "final_rl", "k", 2) and store.checkpoint_uri("r", "final_rl", "k", 6)
    assert store.checkpoint_uri("r", "final_rl", "k", 4) is None

    spec = TrainingSpec(kind="grpo", config={}, model_path="m", rows_path="rows", output_dir=str(tmp_path / "out"),
                        store=store.url, run="r", stage="final_rl", key="k")
    assert fetch_checkpoint(spec, events.append) == 6
    assert sorted(p.name for p in (tmp_path / "out").iterdir()) == ["checkpoint-2", "checkpoint-6"]


def test_status_lines_show_the_alarm_and_the_committed_checkpoint():
    metrics = {"monitor/alarms": 2.0, "monitor/unsafe/first_alarm_step": 40.0, "monitor/selected_step": 20.0,
               "monitor/selected_heldout": 0.62, "monitor/last_heldout": 0.2}
    alarm, selected = status_lines("final_rl", metrics)
    assert "REWARD-HACKING ALARM" in alarm and "unsafe from step 40" in alarm
    assert "committed checkpoint-20 (select_checkpoint: heldout; held-out 0.62, last evaluation 0.2)" in selected
    assert status_lines("final_rl", {"monitor/alarms": 0.0}) == []
