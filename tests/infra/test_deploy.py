"""The deployments (rendered from the stage table, committed as infra/prefect.yaml) and flows.deploy/
flows.dispatch without a server: what gets registered where."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from flows.deploy import (DEFAULT_POOLS, PREFECT_FILE, ROOT, DeployError, enter_project_dir, prefect_spec,
                          render_prefect_file)
from flows.dispatch import stage_deployments
from tasks.config.stages import stage_names

STAGES = stage_names()
SPEC = yaml.safe_load(PREFECT_FILE.read_text())
GPU_STAGES = {"cold_start_sft", "reward_model", "grpo_train", "rejection_sample", "sft_consolidate", "final_rl"}


def by_entrypoint() -> dict[str, dict]:
    return {d["entrypoint"]: d for d in SPEC["deployments"]}


def test_every_stage_and_the_pipeline_has_a_deployment_on_the_right_pool() -> None:
    deployments = by_entrypoint()
    assert deployments["flows/r1_pipeline.py:r1_pipeline"]["work_pool"]["name"] == "cpu"
    assert deployments["flows/r1_pipeline.py:r1_pipeline"]["parameters"]["dispatch"] == "deployments"
    for stage in STAGES:
        d = deployments[f"flows/stages.py:{stage}_flow"]
        assert d["work_pool"]["name"] == ("gpu" if stage in GPU_STAGES else "cpu"), stage
        limit = d.get("concurrency_limit")
        assert (limit == {"limit": 1, "collision_strategy": "ENQUEUE"}) == (stage in GPU_STAGES), stage
    assert set(stage_deployments()) == set(STAGES)
    assert stage_deployments()["grpo_train"] == "grpo-train/gpu"
    assert stage_deployments()["prepare_data"] == "prepare-data/cpu"


def test_entrypoints_are_root_relative_and_name_the_flows_dispatch_expects() -> None:
    from prefect.flows import load_flow_from_entrypoint

    for entrypoint in by_entrypoint():
        path, _, _ = entrypoint.partition(":")
        assert not Path(path).is_absolute() and (ROOT / path).is_file(), entrypoint
    flow = load_flow_from_entrypoint(str(ROOT / "flows/stages.py") + ":grpo_train_flow")
    assert f"{flow.name}/gpu" == stage_deployments()["grpo_train"]


def test_schedules_are_created_inactive() -> None:
    schedules = [s for d in SPEC["deployments"] for s in d.get("schedules") or []]
    assert schedules and all(s["active"] is False for s in schedules)


def test_renaming_pools_changes_only_the_pool_names() -> None:
    rendered = yaml.safe_load(render_prefect_file({"cpu": "laptop", "gpu": "a100"}))
    pools = {d["entrypoint"]: d["work_pool"]["name"] for d in rendered["deployments"]}
    assert pools["flows/stages.py:prepare_data_flow"] == "laptop"
    assert pools["flows/stages.py:grpo_train_flow"] == "a100"
    original = prefect_spec(DEFAULT_POOLS)
    for a, b in zip(rendered["deployments"], original["deployments"]):
        assert {k: v for k, v in a.items() if k != "work_pool"} == {k: v for k, v in b.items() if k != "work_pool"}
    assert rendered["definitions"]["work_pools"]["gpu"]["name"] == "a100"  # written once, as an anchor


def test_pull_step_enters_the_project_from_a_checkout_or_an_image(tmp_path: Path,
                                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    (step,) = SPEC["pull"]
    assert list(step) == ["flows.deploy.enter_project_dir"]
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("R1_PROJECT_DIR", raising=False)
    assert enter_project_dir() == {"directory": str(ROOT)} and Path.cwd() == ROOT  # a checkout
    monkeypatch.setenv("R1_PROJECT_DIR", str(ROOT))  # what the images set (/opt/r1-pipeline)
    monkeypatch.chdir(tmp_path)
    enter_project_dir()
    assert Path.cwd() == ROOT
    monkeypatch.setenv("R1_PROJECT_DIR", str(tmp_path))
    with pytest.raises(DeployError, match="not an r1-pipeline checkout"):
        enter_project_dir()


def test_deploy_refuses_without_a_server(monkeypatch: pytest.MonkeyPatch) -> None:
    from prefect.settings import PREFECT_API_URL, temporary_settings

    from flows.deploy import deploy

    with temporary_settings(updates={PREFECT_API_URL: None}):
        with pytest.raises(DeployError, match="no Prefect server"):
            deploy()


def test_images_set_the_project_dir_the_pull_step_reads() -> None:
    for name in ("Dockerfile.cpu", "Dockerfile.gpu"):
        text = (ROOT / "infra" / "docker" / name).read_text()
        assert "R1_PROJECT_DIR=/opt/r1-pipeline" in text and "WORKDIR /opt/r1-pipeline" in text
