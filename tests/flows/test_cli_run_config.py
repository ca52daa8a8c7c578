"""``r1 run --run NAME`` without -c goes on with the config run NAME recorded (as ``r1 stage`` does), not the
embedded default; -c FILE still wins, a new run gets the embedded default, and a recorded config that no longer
loads fails naming its file."""

from __future__ import annotations

import contextlib

import pytest
from typer.testing import CliRunner

import flows.cli
from flows.cli import app
from flows.stages import RUN_CONFIG, record_run_config
from tasks.config.pipeline import DEFAULT_CONFIG, load_config
from tasks.storage.store import Store

CI_CONFIG = DEFAULT_CONFIG.parent / "ci-tiny.yaml"


class Started(Exception):
    """The pipeline would start here: the test has what it wanted to see."""


@pytest.fixture
def started_with(monkeypatch):
    """Run the CLI up to the pipeline's start and return the config it would run with (no Prefect server)."""
    seen = {}

    def run_flow(_flow, **kwargs):
        seen.update(kwargs)
        raise Started

    monkeypatch.setattr(flows.cli, "_run_flow", run_flow)
    monkeypatch.setattr(flows.cli, "_prefect_api", contextlib.nullcontext)

    def invoke(*args: str):
        result = CliRunner().invoke(app, ["run", *args])
        assert isinstance(result.exception, Started), result.output
        return seen["config"], result.output
    return invoke


def test_an_existing_run_goes_on_with_the_config_it_recorded(tmp_path, started_with):
    store = Store(tmp_path / "store")
    recorded = load_config(CI_CONFIG).with_seed(5)
    record_run_config(store, "mine", recorded)
    config, output = started_with("--run", "mine", "--from-stage", "final_rl", "--store", store.url)
    assert config.model_dump() == recorded.model_dump()
    assert "the config it recorded" in output
    # --seed on it: the run's own seed passes and is kept
    config, _ = started_with("--run", "mine", "--seed", "5", "--store", store.url)
    assert config.model_dump() == recorded.model_dump()


def test_c_wins_and_a_new_run_gets_the_embedded_default(tmp_path, started_with):
    store = Store(tmp_path / "store")
    record_run_config(store, "mine", load_config(CI_CONFIG).with_seed(5))
    config, _ = started_with("-c", str(DEFAULT_CONFIG), "--run", "mine", "--store", store.url)
    assert config.model_dump() == load_config(DEFAULT_CONFIG).model_dump()
    config, output = started_with("--run", "fresh", "--store", store.url)
    assert config.model_dump() == load_config(DEFAULT_CONFIG).model_dump()
    assert "the config it recorded" not in output


def test_a_recorded_config_that_does_not_load_fails_naming_its_file(tmp_path, started_with):
    store = Store(tmp_path / "store")
    store.write_run_file("mine", RUN_CONFIG, {"config": {"grpo_train": {"no_such_field": 1}}})
    result = CliRunner().invoke(app, ["run", "--run", "mine", "--store", store.url])
    assert result.exit_code == 1
    line = result.output.strip().splitlines()[-1]
    assert line.startswith("error: ") and RUN_CONFIG in line and "-c FILE" in line
