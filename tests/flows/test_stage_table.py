"""The stage table is the one place stages are defined: a new entry appears in the pipeline's order, the CLI
help, the stage flows and the deployments with no other edit; the pipeline deployment's default config is
the one ``r1 run`` uses."""

from __future__ import annotations

import yaml
from typer.testing import CliRunner

import tasks.stages
from flows.deploy import PREFECT_FILE, prefect_spec, render_prefect_file
from flows.dispatch import stage_deployments
from flows.r1_pipeline import Dispatcher
from tasks.config import DEFAULT_CONFIG, PipelineConfig, load_config
from tasks.stages import Stage, all_stages, get_stage, stage_names


def seventh_stage() -> Stage:
    """A stage after final_rl that reads the final model (its task is final_rl's: the table only needs one)."""
    return Stage("distill_small", get_stage("final_rl").task, ("prepare_data", "final_rl"), "sft", "gpu",
                 "Stage 7: distil the final model into a smaller one.")


def test_a_seventh_stage_appears_everywhere(monkeypatch):
    from flows import cli, stages as stage_flows

    monkeypatch.setattr(tasks.stages, "STAGES", (*tasks.stages.STAGES, seventh_stage()))

    # the pipeline's order (the r1_pipeline flow runs all_stages() in order) and its selection
    assert [s.name for s in all_stages()][-2:] == ["final_rl", "distill_small"]
    plan = Dispatcher.plan(PipelineConfig(), "r", "/tmp/s", None, "final_rl", "inline")
    assert plan.selected == ["final_rl", "distill_small"] == plan.forced
    # the CLI's help
    help_text = CliRunner().invoke(cli.build_app(), ["stage", "--help"]).output
    assert "distill_small" in help_text and "Stage 7: distil" in help_text
    assert "distill_small" in CliRunner().invoke(cli.build_app(), ["--help"]).output
    # its flow and deployment
    flow = stage_flows.distill_small_flow
    assert flow.name == "distill-small" and stage_flows.stage_flow("distill_small") is flow
    deployments = {d["entrypoint"]: d for d in prefect_spec()["deployments"]}
    d = deployments["flows/stages.py:distill_small_flow"]
    assert d["work_pool"]["name"] == "gpu" and d["concurrency_limit"]["limit"] == 1
    assert stage_deployments()["distill_small"] == "distill-small/gpu"
    assert "distill_small_flow" in render_prefect_file()


def test_the_table_is_in_dependency_order():
    seen: set[str] = set()
    rm_everywhere = PipelineConfig.model_validate({
        "reward_model": {"init_from": "cold_start_sft"},
        **{s: {"reward_funcs": ["format", {"reward_model": {"model": "reward_model"}}]} for s in ("grpo_train", "final_rl")},
    })
    for config in (PipelineConfig(), load_config(DEFAULT_CONFIG), rm_everywhere):
        seen.clear()
        for stage in all_stages():
            assert set(stage.inputs(config)) <= seen, f"{stage.name} reads a stage that runs after it"
            seen.add(stage.name)
    assert "reward_model" in get_stage("final_rl").inputs(rm_everywhere)
    assert stage_names() == ["prepare_data", "cold_start_sft", "reward_model", "grpo_train", "rejection_sample",
                             "sft_consolidate", "final_rl"]


def test_committed_prefect_file_is_the_table_rendered():
    assert PREFECT_FILE.read_text() == render_prefect_file(), (
        "infra/prefect.yaml is out of date with tasks/stages.py; run `python -m flows.deploy`")
    assert yaml.safe_load(PREFECT_FILE.read_text()) == prefect_spec()


def test_pipeline_deployment_without_parameters_runs_the_r1_run_config(tmp_path):
    """`prefect deployment run 'r1-pipeline/cpu'` passes the deployment's parameters; resolved the way the flow
    resolves them, they give exactly the config `r1 run` (no -c) loads. With a config_path, that file."""
    from flows.cli import _config
    from flows.r1_pipeline import pipeline_config

    (pipeline,) = [d for d in prefect_spec()["deployments"] if d["entrypoint"].endswith(":r1_pipeline")]
    params = pipeline["parameters"]
    resolved = pipeline_config(params.get("config"), params.get("config_path"))
    assert resolved == _config(None) == load_config(DEFAULT_CONFIG)
    assert resolved.cold_start_sft.max_steps != PipelineConfig().cold_start_sft.max_steps  # not the bare defaults
    other = tmp_path / "other.yaml"
    other.write_text("grpo_train:\n  beta: 0.123\n")
    assert pipeline_config(None, str(other)).grpo_train.beta == 0.123
