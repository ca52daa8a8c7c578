"""``r1 stage STAGE -c CONFIG --run X`` records the run's config as ``r1 run -c`` does (issue 26), so the next
``r1 stage`` without -c reads it back; and the evaluation after the stage says which sampler it used and why."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml
from typer.testing import CliRunner

from flows.cli import app
from flows.stages import RUN_CONFIG
from tasks.config.pipeline import load_config
import tasks.stages.evaluate
from tasks.storage.store import Store

ROOT = Path(__file__).resolve().parents[2]
RUN = "staged"


@pytest.fixture
def tiny_config(tmp_path) -> Path:
    """configs/ci-tiny.yaml made shorter still: fewer rows and SFT steps (the CLI takes no overrides)."""
    raw = yaml.safe_load((ROOT / "configs" / "ci-tiny.yaml").read_text())
    raw["data"].update(num_train=16, num_eval=4, cold_start_size=16)
    raw["cold_start_sft"].update(max_steps=1, per_device_train_batch_size=4)
    raw["evaluate"]["sampling"].update(max_completion_length=8)
    raw["evaluate"].update(max_rows=4)
    path = tmp_path / "tiny.yaml"
    path.write_text(yaml.safe_dump(raw))
    return path


def test_stage_with_a_config_records_it_for_the_next_stage(tiny_config, tmp_path, monkeypatch):
    store, runner = tmp_path / "store", CliRunner()
    backends = []
    make = tasks.stages.evaluate.make_eval_backend

    def spy(cfg, model_path, why="evaluate.sampling.use_vllm"):
        backends.append((cfg.sampling.use_vllm, why))
        return make(cfg, model_path, why=why)

    monkeypatch.setattr(tasks.stages.evaluate, "make_eval_backend", spy)

    first = runner.invoke(app, ["stage", "prepare_data", "-c", str(tiny_config), "--run", RUN, "--store", str(store)])
    assert first.exit_code == 0, first.output
    saved = Store(store).read_run_file(RUN, RUN_CONFIG)
    assert saved is not None and saved["config"] == load_config(tiny_config).model_dump(mode="json")

    second = runner.invoke(app, ["stage", "cold_start_sft", "--run", RUN, "--store", str(store)])  # no -c
    assert second.exit_code == 0, second.output
    assert "cold_start_sft: committed" in second.output
    # evaluate.sampling.use_vllm is unset in the config: the SFT model is evaluated with grpo_train's sampler (false)
    assert backends == [(False, "evaluate.sampling.use_vllm unset, so grpo_train.sampling.use_vllm")]


def test_stage_with_another_config_replaces_the_recorded_one_as_run_does(tiny_config, tmp_path):
    store = Store(tmp_path / "store")
    other = tmp_path / "other.yaml"
    raw = yaml.safe_load(tiny_config.read_text())
    raw["data"]["num_eval"] = 5
    other.write_text(yaml.safe_dump(raw))
    for path in (tiny_config, other):
        result = CliRunner().invoke(app, ["stage", "prepare_data", "-c", str(path), "--run", RUN, "--store", store.url])
        assert result.exit_code == 0, result.output
        assert store.read_run_file(RUN, RUN_CONFIG)["config"]["data"]["num_eval"] == load_config(path).data.num_eval
