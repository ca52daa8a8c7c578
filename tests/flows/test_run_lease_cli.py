"""``r1 run`` and ``r1 stage`` hold the run's lease: a second writer fails at once naming the holder, a stale
lease is taken over, ``--force-unlock`` takes a live one. The flows are replaced by a stub that records who
held the lease while it ran (the pipeline itself is tested in test_pipeline.py)."""

from __future__ import annotations

import contextlib
import json
import logging
import os
import socket
import time

import pytest
from typer.testing import CliRunner

import flows.cli
from flows.cli import app
from tasks.storage.lease import LEASE, acquire_lease
from tasks.storage.store import Store

RUN = "same"


@pytest.fixture
def flow_calls(monkeypatch):
    """Replaces the flow call; each call records the lease file as it was while the 'flow' ran."""
    calls = []

    def fake_run_flow(fn, **params):
        st = Store(params["store"])
        calls.append(json.loads(st.read_text(st.run_file(RUN, LEASE))))
        return {"report": "r"} if "run_name" in params else {"path": f"{RUN}/prepare_data/v1"}

    monkeypatch.setattr(flows.cli, "_run_flow", fake_run_flow)
    return calls


def test_second_writer_fails_fast_naming_the_holder(tmp_path, flow_calls, monkeypatch):
    started = []  # the Prefect API (a temporary server takes seconds) is not started for a refused run
    monkeypatch.setattr(flows.cli, "_prefect_api", lambda: started.append("api") or contextlib.nullcontext())
    store = Store(tmp_path)
    holder = acquire_lease(store, RUN, settle_s=0)
    before = sorted(p.relative_to(tmp_path).as_posix() for p in tmp_path.rglob("*"))
    t = time.monotonic()
    result = CliRunner().invoke(app, ["run", "--run", RUN, "--store", str(tmp_path)])
    assert result.exit_code == 1 and time.monotonic() - t < 10
    last = result.output.strip().splitlines()[-1]
    assert last.startswith(f"error: run '{RUN}' in {store.url} is being written by {socket.gethostname()} "
                           f"pid {os.getpid()} (since {holder.since}")
    assert "--force-unlock" in last
    assert flow_calls == [] and started == []  # no stage started, nor the Prefect API
    assert sorted(p.relative_to(tmp_path).as_posix() for p in tmp_path.rglob("*")) == before  # nothing written
    assert json.loads(store.read_text(store.run_file(RUN, LEASE)))["owner"] == holder.owner


def test_stale_lease_is_taken_over_and_released(tmp_path, flow_calls, caplog):
    store = Store(tmp_path)
    store.write_json(store.run_file(RUN, LEASE), {"owner": "dead", "host": "gone-host", "pid": 4242,
                                                 "since": "2026-01-01T00:00:00Z", "expires_at": time.time() - 1})
    with caplog.at_level(logging.WARNING, logger="r1.lease"):
        result = CliRunner().invoke(app, ["run", "--run", RUN, "--store", str(tmp_path)])
    assert result.exit_code == 0, result.output
    # Prefect's logging setup, when this is the first command to enter the Prefect API, replaces the root handlers
    # caplog listens on: the line then reaches the terminal (the command's output) instead
    said = caplog.text + result.output
    assert "taking over the stale lease" in said and "gone-host pid 4242" in said
    assert [(c["pid"], c["owner"] != "dead") for c in flow_calls] == [(os.getpid(), True)]
    assert not store.exists(store.run_file(RUN, LEASE))  # released at the end


def test_force_unlock_takes_a_live_lease(tmp_path, flow_calls):
    store = Store(tmp_path)
    holder = acquire_lease(store, RUN, settle_s=0)
    result = CliRunner().invoke(app, ["stage", "prepare_data", "--run", RUN, "--store", str(tmp_path)])
    assert result.exit_code == 1 and "--force-unlock" in result.output and flow_calls == []
    result = CliRunner().invoke(app, ["stage", "prepare_data", "--run", RUN, "--store", str(tmp_path),
                                      "--force-unlock"])
    assert result.exit_code == 0, result.output
    assert len(flow_calls) == 1 and flow_calls[0]["owner"] != holder.owner
    assert not store.exists(store.run_file(RUN, LEASE))


@pytest.mark.parametrize("failure, exit_code", [(KeyboardInterrupt, 130), (lambda: flows.cli._fail("boom"), 1)])
def test_lease_is_released_when_the_run_fails(tmp_path, monkeypatch, failure, exit_code):
    def failing_flow(fn, **params):
        if failure is KeyboardInterrupt:
            raise KeyboardInterrupt  # Ctrl-C; click turns it into "Aborted!" and exit code 130
        failure()

    monkeypatch.setattr(flows.cli, "_run_flow", failing_flow)
    result = CliRunner().invoke(app, ["run", "--run", RUN, "--store", str(tmp_path)])
    assert result.exit_code == exit_code, result.output
    assert not Store(tmp_path).exists(Store(tmp_path).run_file(RUN, LEASE))
