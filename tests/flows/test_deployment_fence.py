"""Stages dispatched to workers (``--dispatch deployments``) hold no lease themselves: the pipeline hands them its
lease token, and their commits are refused once another live writer holds the run (issue 33: deployments-mode
commits were unfenced)."""

from __future__ import annotations

import time
from pathlib import Path

import pytest
import yaml

import flows.dispatch
from flows.r1_pipeline import Dispatcher
from flows.stages import stage_flow
from tasks.config.pipeline import load_config
from tasks.config.stages import get_stage
from tasks.storage.lease import LEASE, LeaseLost, acquire_lease
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
