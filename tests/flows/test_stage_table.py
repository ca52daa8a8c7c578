"""The stage table is the one place stages are defined: a new entry appears in the pipeline's order, the CLI
help, the stage flows and the deployments with no other edit, and a stage added by one entry plus one module
runs inside ``r1 run``, its config section in the YAML; the pipeline deployment's default config is the one
``r1 run`` uses."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import yaml
from typer.testing import CliRunner

from flows.deploy import PREFECT_FILE, prefect_spec, render_prefect_file
from flows.dispatch import stage_deployments
from flows.r1_pipeline import Dispatcher
from tasks.config.pipeline import DEFAULT_CONFIG, PipelineConfig, load_config
import tasks.config.stages
from tasks.config.stages import Stage, all_stages, get_stage, stage_names
from tasks.storage.store import Store


def seventh_stage() -> Stage:
    """A stage after final_rl that reads the final model (its task is final_rl's: the table only needs one)."""
    return Stage("distill_small", ("prepare_data", "final_rl"), "sft", "gpu",
                 "Stage 7: distil the final model into a smaller one.", get_stage("final_rl").section,
                 task_ref="tasks.stages.final_rl:final_rl")


def test_a_seventh_stage_appears_everywhere(monkeypatch):
    from flows import cli, stages as stage_flows

    monkeypatch.setattr(tasks.config.stages, "STAGES", (*tasks.config.stages.STAGES, seventh_stage()))

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


ROOT = Path(__file__).resolve().parents[2]

# The one module of the new stage: a stage_task body that reads prepare_data's rows and commits a count.
STAGE_MODULE = '''
"""count_rows: counts prepare_data's training rows (a stage added by tests/flows/test_stage_table.py)."""
import json

from grpo_core.data.rows import read_parquet
from tasks.runner.common import StageContext, commit_stage, stage_task


@stage_task("count_rows")
def count_rows(ctx: StageContext, parents, fp: str):
    rows = read_parquet(ctx.fetch(parents["prepare_data"], "train.parquet"))
    section = ctx.config.count_rows  # its own section, from the YAML
    out = ctx.work / "count.json"
    out.write_text(json.dumps({"rows": len(rows), "first": [r["prompt"] for r in rows[:section.show]]}))
    with ctx.begin() as writer:
        writer.put_file(out, "count.json")
        return commit_stage(ctx, writer, fp=fp, section=section, parents=parents,
                            metrics={"data/num_rows": len(rows), "data/shown": section.show})
'''

# The one table entry (its section type beside it), added before anything builds PipelineConfig, as an entry in
# tasks/config/stages.py is; then the real `r1` command line, once per argument list.
LAUNCHER = '''
import json
import sys

from pydantic import BaseModel, ConfigDict, Field

import tasks.config.stages as table


class CountRowsConfig(BaseModel):
    model_config = ConfigDict(extra="forbid")
    show: int = Field(1, ge=0)
    seed: int = 0


table.STAGES = (table.STAGES[0], table.Stage(
    "count_rows", ("prepare_data",), "data", "cpu", "Counts prepare_data's training rows.", CountRowsConfig,
    task_ref="count_rows_stage:count_rows", seeded=("seed",)), *table.STAGES[1:])

from flows.cli import build_app

for args in json.loads(sys.argv[1]):
    print("=== r1 " + " ".join(args), flush=True)
    code = build_app()(args, standalone_mode=False)  # a click.exceptions.Exit's code comes back here
    if code:
        sys.exit(code)
'''


@pytest.mark.slow
def test_a_stage_added_by_one_entry_and_one_module_runs_in_r1_run(tmp_path):
    """One entry (tasks/config/stages.py's form) and one module: `r1 run` runs the stage in table order on a tiny config
    with its own YAML section, commits its output to the store, and `r1 status` shows it; its section is a field
    of PipelineConfig, its seed one of the run's seeds. Nothing else in the repository is edited."""
    from prefect.settings import PREFECT_API_URL

    (tmp_path / "count_rows_stage.py").write_text(textwrap.dedent(STAGE_MODULE))
    (tmp_path / "launch_r1.py").write_text(textwrap.dedent(LAUNCHER))
    config = yaml.safe_load((ROOT / "configs" / "ci-tiny.yaml").read_text())
    for name in ("cold_start_sft", "grpo_train", "sft_consolidate", "final_rl"):  # the shortest run that is a run
        config[name].update(max_steps=1, save_steps=1)
    config["rejection_sample"]["max_prompts"] = 2
    config["evaluate"]["max_rows"] = 2
    config["count_rows"] = {"show": 2}
    (tmp_path / "config.yaml").write_text(yaml.safe_dump(config))
    store = tmp_path / "store"
    before = _worktree_state()
    commands = [["run", "-c", str(tmp_path / "config.yaml"), "--run", "added", "--store", str(store)],
                ["status", "added", "--json", "--store", str(store)], ["--help"]]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(tmp_path), str(ROOT)]),
           "PREFECT_API_URL": str(PREFECT_API_URL.value()), "R1_WORKDIR": str(tmp_path / "work")}
    done = subprocess.run([sys.executable, str(tmp_path / "launch_r1.py"), json.dumps(commands)], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-5000:]
    out = done.stdout
    status = json.loads(out.split("=== r1 status")[1].split("\n", 1)[1].split("=== r1 --help")[0])
    assert list(status["stages"])[:3] == ["prepare_data", "count_rows", "cold_start_sft"]  # table order
    counted = status["stages"]["count_rows"]
    assert counted["state"] == "completed" and counted["metrics"] == {"data/num_rows": 64.0, "data/shown": 2.0}
    assert status["stages"]["final_rl"]["state"] == "completed"  # the rest of the pipeline ran around it
    assert status["seeds"]["count_rows.seed"] == 0  # its seeded field is one of the run's seeds
    ref = Store(str(store)).latest("added", "count_rows")
    manifest = Store(str(store)).manifest(ref)
    assert manifest["config"]["count_rows"] == {"show": 2, "seed": 0}  # the YAML section reached the stage
    assert set(manifest["parents"]) == {"prepare_data"}
    assert len(json.loads(Store(str(store)).read_output(ref, "count.json"))["first"]) == 2
    assert "count_rows: Counts prepare_data's training rows." in out.split("=== r1 --help")[1]
    assert _worktree_state() == before  # no file of the repository was written to make it run


def _worktree_state() -> str:
    return subprocess.run(["git", "status", "--porcelain"], cwd=ROOT, capture_output=True, text=True).stdout


def test_committed_prefect_file_is_the_table_rendered():
    assert PREFECT_FILE.read_text() == render_prefect_file(), (
        "infra/prefect.yaml is out of date with tasks/config/stages.py; run `python -m flows.deploy`")
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
