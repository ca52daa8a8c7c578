"""Stages dispatched to workers (``--dispatch deployments``) hold no lease themselves: the pipeline hands them its
lease token, and their commits are refused once another live writer holds the run (issue 33: deployments-mode
commits were unfenced); the stage watches the lease and stops its training child within the lease's TTL of a
takeover (issue 45: it trained, and checkpointed, to the end of the stage)."""

from __future__ import annotations

import threading
import time
from pathlib import Path

import psutil
import pytest
import yaml

import flows.dispatch
from flows.r1_pipeline import Dispatcher
from flows.stages import stage_flow
from tasks.config.pipeline import PipelineConfig, load_config
from tasks.config.stages import get_stage
from tasks.storage.lease import LEASE, TTL_S, LeaseLost, acquire_lease
from tasks.storage.store import Store

ROOT = Path(__file__).resolve().parents[2]
RUN = "fenced"


@pytest.fixture
def config(tmp_path):
    raw = yaml.safe_load((ROOT / "configs" / "ci-tiny.yaml").read_text())
    raw["data"].update(num_train=16, num_eval=4, cold_start_size=16)
    path = tmp_path / "c.yaml"
    path.write_text(yaml.safe_dump(raw))
    return load_config(path)


def _lease_of(store: Store, owner: str) -> None:
    store.write_json(store.run_file(RUN, LEASE), {"owner": owner, "host": "pipeline-host", "pid": 1,
                                                 "since": "2026-12-03T00:00:00Z", "heartbeat_at": time.time(),
                                                 "expires_at": time.time() + 60})


def test_a_dispatched_stage_commits_only_while_its_pipeline_holds_the_run(config, tmp_path):
    store = Store(tmp_path / "store")
    _lease_of(store, "another-writer")  # the run was taken over while the stage ran on its worker
    with pytest.raises(LeaseLost, match="now written by pipeline-host pid 1"):
        stage_flow("prepare_data")(run=RUN, config=config, store=store.url, lease_owner="dispatching-pipeline")
    assert store.latest(RUN, "prepare_data") is None

    _lease_of(store, "dispatching-pipeline")  # still the dispatching pipeline's: the commit goes through
    stage_flow("prepare_data")(run=RUN, config=config, store=store.url, lease_owner="dispatching-pipeline")
    assert store.latest(RUN, "prepare_data") is not None


def test_the_pipeline_hands_its_lease_token_to_the_deployments_it_runs(config, tmp_path, monkeypatch):
    store = Store(tmp_path / "store")
    sent = []
    monkeypatch.setattr(flows.dispatch, "run_stage_deployment", lambda stage, params: sent.append(params) or None)
    lease = acquire_lease(store, RUN, settle_s=0)
    try:
        Dispatcher.plan(config, RUN, store.url, None, None, "deployments").run_stage(get_stage("prepare_data"), {})
    finally:
        lease.release()
    assert sent[0]["lease_owner"] == lease.owner


def _training_children() -> list[psutil.Process]:
    out = []
    for proc in psutil.Process().children(recursive=True):
        try:
            if "tasks.runner.worker" in " ".join(proc.cmdline()):
                out.append(proc)
        except psutil.NoSuchProcess:
            pass
    return out


def test_a_dispatched_stage_stops_its_training_within_the_lease_ttl_of_a_takeover(tmp_path):
    """A dispatched cold_start_sft that would train for minutes without a checkpoint: after another writer takes
    the run, the stage's lease watch stops its training child, within the TTL (a guard ends it after 1.5 TTL)."""
    from tests.tasks.test_training_spec import TINY, commit_prepare_data

    config = PipelineConfig.model_validate({
        "model": {"tiny": TINY},
        "cold_start_sft": {"max_steps": 1_000_000, "per_device_train_batch_size": 4, "max_length": 64,
                           "save_steps": 1_000_000, "report_to": ["jsonl"]},
        "run": {"isolation": "subprocess", "torch_num_threads": 1, "retries": 0}})
    store = Store(tmp_path / "store")
    data = commit_prepare_data(store, RUN, tmp_path)
    _lease_of(store, "dispatching-pipeline")
    taken: dict[str, float] = {}

    def take_over_then_guard() -> None:
        deadline = time.monotonic() + 120
        while not _training_children() and time.monotonic() < deadline:
            time.sleep(0.1)
        time.sleep(1)
        _lease_of(store, "another-writer")
        taken["at"] = time.monotonic()
        while _training_children() and time.monotonic() < taken["at"] + 1.5 * TTL_S:
            time.sleep(0.2)
        for proc in _training_children():  # still training: end it so that the test ends
            proc.kill()

    guard = threading.Thread(target=take_over_then_guard, daemon=True)
    guard.start()
    with pytest.raises(Exception) as err:
        stage_flow("cold_start_sft")(run=RUN, config=config, store=store.url,
                                     inputs={"prepare_data": data.to_dict()}, lease_owner="dispatching-pipeline")
    ended = time.monotonic()
    guard.join(timeout=10)
    print(f"stopped {ended - taken['at']:.1f} s after the takeover")
    assert ended - taken["at"] < TTL_S, f"the stage ran {ended - taken['at']:.0f} s after the takeover"
    assert "now written by pipeline-host pid 1" in str(err.value) and "stopped" in str(err.value)
    assert store.latest(RUN, "cold_start_sft") is None
