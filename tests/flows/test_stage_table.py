"""The stage table is the one place stages are defined: a new entry appears in the pipeline's order, the CLI
help, the stage flows and the deployments with no other edit; a stage added by one entry plus one short module (a
data stage, a training stage), or by one entry alone (an RL stage), runs inside ``r1 run``, its config section in
the YAML, and a model it makes is evaluated; an entry that does not fit the table is refused when it is built; the
pipeline deployment's default config is the one ``r1 run`` uses."""

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
from grpo_core.config import GRPOConfig
from tasks.config.sections import ConsolidateConfig
from tasks.config.stages import RL, Stage, StageTableError, all_stages, check_table, get_stage, stage_names
from tasks.storage.store import Store

ROOT = Path(__file__).resolve().parents[2]


def seventh_stage() -> Stage:
    """A stage after final_rl that trains the final model further: an RL stage is one entry (the RL body)."""
    return Stage("more_rl", ("prepare_data", "final_rl"), "grpo", "gpu", "Stage 7: GRPO again from the final model.",
                 GRPOConfig, body=RL, init_from="final_rl")


def test_a_seventh_stage_appears_everywhere(monkeypatch):
    from flows import cli, stages as stage_flows

    monkeypatch.setattr(tasks.config.stages, "STAGES", (*tasks.config.stages.STAGES, seventh_stage()))

    # the pipeline's order (the r1_pipeline flow runs all_stages() in order) and its selection
    assert [s.name for s in all_stages()][-2:] == ["final_rl", "more_rl"]
    plan = Dispatcher.plan(PipelineConfig(), "r", "/tmp/s", None, "final_rl", "inline")
    assert plan.selected == ["final_rl", "more_rl"] == plan.forced
    # the CLI's help
    help_text = CliRunner().invoke(cli.build_app(), ["stage", "--help"]).output
    assert "more_rl" in help_text and "Stage 7: GRPO again" in help_text
    assert "more_rl" in CliRunner().invoke(cli.build_app(), ["--help"]).output
    # its flow, deployment and task (the RL body's, named after this entry)
    flow = stage_flows.more_rl_flow
    assert flow.name == "more-rl" and stage_flows.stage_flow("more_rl") is flow
    deployments = {d["entrypoint"]: d for d in prefect_spec()["deployments"]}
    d = deployments["flows/stages.py:more_rl_flow"]
    assert d["work_pool"]["name"] == "gpu" and d["concurrency_limit"]["limit"] == 1
    assert stage_deployments()["more_rl"] == "more-rl/gpu"
    assert "more_rl_flow" in render_prefect_file()
    task = get_stage("more_rl").task
    assert task.name == "more_rl" and task.fn.__module__ == "tasks.stages.rl"
    assert task is not get_stage("final_rl").task and get_stage("final_rl").task.name == "final_rl"


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


def test_an_entry_that_does_not_fit_the_table_is_refused_when_built():
    # a training kind's section is its trainer's config (a subclass with stage-only fields is one)
    with pytest.raises(StageTableError) as e:
        Stage("distill", ("prepare_data", "final_rl"), "sft", "gpu", "SFT from the final model.", GRPOConfig,
              init_from="final_rl")
    msg = str(e.value)
    assert "stage 'distill': kind 'sft' trains with SFTConfig, but its section is GRPOConfig" in msg
    assert "give it a SFTConfig section" in msg and "or kind 'grpo', whose trainer takes a GRPOConfig" in msg
    Stage("distill", ("prepare_data", "final_rl"), "sft", "gpu", "SFT from the final model.", ConsolidateConfig)
    # the stage it starts from is one of the stages it reads
    with pytest.raises(StageTableError, match=r"stage 'more_rl' starts from 'sft_consolidate', which is not among the "
                                              r"stages it reads \('prepare_data', 'final_rl'\); add 'sft_consolidate'"):
        Stage("more_rl", ("prepare_data", "final_rl"), "grpo", "gpu", "GRPO again.", GRPOConfig, body=RL,
              init_from="sft_consolidate")
    # it reads only stages before it, and its name is its own
    table = [s for s in tasks.config.stages.STAGES if not s.evaluates]
    early = Stage("early", ("prepare_data", "final_rl"), "grpo", "gpu", "GRPO before final_rl.", GRPOConfig, body=RL,
                  init_from="final_rl")
    with pytest.raises(StageTableError, match=r"stage 'early' reads 'final_rl', which is no stage before it in the "
                                              r"table \(before it: prepare_data, cold_start_sft\)"):
        check_table((*table[:2], early, *table[2:]))
    with pytest.raises(StageTableError, match=r"stage 'final_rl' is in the table twice"):
        check_table((*table, table[-1]))
    assert check_table(tuple(table)) == tuple(table)


# The one module of a new data stage: a stage_task body that reads prepare_data's rows and commits a count. Its name,
# kind and section come from its table entry.
STAGE_MODULE = '''
"""count_rows: counts prepare_data's training rows (a stage added by tests/flows/test_stage_table.py)."""
import json

from grpo_core.data.rows import read_parquet
from tasks.runner.common import StageContext, commit_stage, stage_task


@stage_task
def count_rows(ctx: StageContext, parents, fp: str):
    rows = read_parquet(ctx.fetch(parents["prepare_data"], "train.parquet"))
    section = ctx.section  # its own section, from the YAML
    out = ctx.work / "count.json"
    out.write_text(json.dumps({"rows": len(rows), "first": [r["prompt"] for r in rows[:section.show]]}))
    with ctx.begin() as writer:
        writer.put_file(out, "count.json")
        return commit_stage(ctx, writer, fp=fp, parents=parents,
                            metrics={"data/num_rows": len(rows), "data/shown": section.show})
'''

# The one module of a new training stage (kind sft): SFT of the model its entry starts from on the cold-start rows;
# train_and_commit trains with the entry's kind and section.
SFT_MODULE = '''
"""distill: SFT of the final RL model on the cold-start rows (a stage added by tests/flows/test_stage_table.py)."""
from tasks.runner.common import stage_task
from tasks.runner.training import train_and_commit


@stage_task
def distill(ctx, parents, fp):
    return train_and_commit(ctx, model_path=ctx.init_model(parents), parents=parents, fp=fp,
                            rows_path=ctx.fetch(parents["prepare_data"], "cold_start.parquet"))
'''

# The table entries (a section type beside the data stage's), added before anything builds PipelineConfig, as entries
# in tasks/config/stages.py are: count_rows after prepare_data; after final_rl the SFT stage (its module above) and an
# RL stage, one entry with no module, from the SFT stage's model. Then the real `r1` command line, once per argument
# list.
LAUNCHER = '''
import json
import sys

from pydantic import BaseModel, ConfigDict, Field

import tasks.config.stages as table
from grpo_core.config import GRPOConfig, SFTConfig


class CountRowsConfig(BaseModel):
    model_config = ConfigDict(extra="forbid")
    show: int = Field(1, ge=0)
    seed: int = 0


stages = [s for s in table.STAGES if not s.evaluates]
table.STAGES = (stages[0], table.Stage(
    "count_rows", ("prepare_data",), "data", "cpu", "Counts prepare_data's training rows.", CountRowsConfig,
    body="count_rows_stage:count_rows", seeded=("seed",)), *stages[1:],
    table.Stage("distill", ("prepare_data", "final_rl"), "sft", "gpu", "SFT of the final model on the cold-start rows.",
                SFTConfig, body="distill_stage:distill", init_from="final_rl", seeded=("seed",)),
    table.Stage("distill_rl", ("prepare_data", "distill"), "grpo", "gpu", "GRPO from the distilled model.", GRPOConfig,
                body=table.RL, init_from="distill", seeded=("seed",), reward_fields=("reward_funcs",),
                samples_on_gpu=True),
    table.evaluation())

from flows.cli import build_app

for args in json.loads(sys.argv[1]):
    print("=== r1 " + " ".join(args), flush=True)
    code = build_app()(args, standalone_mode=False)  # a click.exceptions.Exit's code comes back here
    if code:
        sys.exit(code)
'''


def test_the_added_stage_modules_are_short():
    """A training stage's module is its inputs and one call: at most 10 lines (the RL stage has none)."""
    assert len(textwrap.dedent(SFT_MODULE).strip().splitlines()) <= 10


@pytest.mark.slow
def test_stages_added_by_entries_and_short_modules_run_in_r1_run(tmp_path):
    """Entries in tasks/config/stages.py's form and two modules: `r1 run` runs a data stage (one entry, one module), a
    training stage (one entry, a module of at most 10 lines) and an RL stage (one entry) in table order on a tiny
    config with their own YAML sections, commits their outputs to the store, evaluates the models they make, and
    `r1 status` shows them; their sections are fields of PipelineConfig, their seeds among the run's seeds. Nothing
    else in the repository is edited."""
    from prefect.settings import PREFECT_API_URL

    (tmp_path / "count_rows_stage.py").write_text(textwrap.dedent(STAGE_MODULE))
    (tmp_path / "distill_stage.py").write_text(textwrap.dedent(SFT_MODULE))
    (tmp_path / "launch_r1.py").write_text(textwrap.dedent(LAUNCHER))
    config = yaml.safe_load((ROOT / "configs" / "ci-tiny.yaml").read_text())
    for name in ("cold_start_sft", "grpo_train", "sft_consolidate", "final_rl"):  # the shortest run that is a run
        config[name].update(max_steps=1, save_steps=1)
    config["rejection_sample"]["max_prompts"] = 2
    config["evaluate"]["max_rows"] = 2
    config["count_rows"] = {"show": 2}
    config["distill"] = {**config["cold_start_sft"], "learning_rate": 1e-3}
    config["distill_rl"] = {**config["final_rl"], "reward_funcs": ["chain_accuracy"], "reward_weights": [1.0]}
    (tmp_path / "config.yaml").write_text(yaml.safe_dump(config))
    store = tmp_path / "store"
    before = _worktree_state()
    commands = [["run", "-c", str(tmp_path / "config.yaml"), "--run", "added", "--store", str(store)],
                ["status", "added", "--json", "--store", str(store)], ["--help"]]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(tmp_path), str(ROOT)]),
           "PREFECT_API_URL": str(PREFECT_API_URL.value()), "R1_WORKDIR": str(tmp_path / "work")}
    done = subprocess.run([sys.executable, str(tmp_path / "launch_r1.py"), json.dumps(commands)], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=1200)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-5000:]
    out = done.stdout
    status = json.loads(out.split("=== r1 status")[1].split("\n", 1)[1].split("=== r1 --help")[0])
    assert list(status["stages"])[:3] == ["prepare_data", "count_rows", "cold_start_sft"]  # table order
    assert list(status["stages"])[-3:] == ["final_rl", "distill", "distill_rl"]
    counted = status["stages"]["count_rows"]
    assert counted["state"] == "completed" and counted["metrics"] == {"data/num_rows": 64.0, "data/shown": 2.0}
    assert status["seeds"]["count_rows.seed"] == 0  # its seeded field is one of the run's seeds
    st = Store(str(store))
    ref = st.latest("added", "count_rows")
    manifest = st.manifest(ref)
    assert manifest["config"]["count_rows"] == {"show": 2, "seed": 0}  # the YAML section reached the stage
    assert set(manifest["parents"]) == {"prepare_data"}
    assert len(json.loads(st.read_output(ref, "count.json"))["first"]) == 2
    # the training stages: each trained its entry's kind on its own section, from the model init_from names, and
    # its model was evaluated
    for name, kind, start in (("distill", "sft", "final_rl"), ("distill_rl", "grpo", "distill")):
        assert status["stages"][name]["state"] == "completed", name
        assert status["seeds"][f"{name}.seed"] == 0
        ref = st.latest("added", name)
        manifest = st.manifest(ref)
        assert manifest["training"]["kind"] == kind and set(manifest["parents"]) == {"prepare_data", start}
        assert manifest["parents"][start]["version"] == st.latest("added", start).version
        assert manifest["config"][name]["max_steps"] == 1 and st.exists(f"{ref.uri}/model")
        evaluated = st.manifest(st.latest("added", f"evaluate/{name}"))
        assert evaluated["parents"]["model"]["version"] == ref.version
        assert "eval/accuracy" in status["stages"][name]["metrics"]
    assert st.manifest(st.latest("added", "distill"))["config"]["distill"]["learning_rate"] == 1e-3
    assert st.manifest(st.latest("added", "distill_rl"))["config"]["distill_rl"]["reward_funcs"] == ["chain_accuracy"]
    help_text = out.split("=== r1 --help")[1]
    assert "count_rows: Counts prepare_data's training rows." in help_text and "distill_rl: GRPO from" in help_text
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
