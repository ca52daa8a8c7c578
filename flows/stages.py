"""One Prefect flow per stage, so any stage can be run, rerun or deployed on its own.

    r1 stage grpo_train --run NAME        (the CLI; or call grpo_train_flow(run="NAME") from Python)

A stage flow reads its upstream inputs from the store (the newest committed output of each upstream
stage) unless the caller passes them, runs the stage's task, then ``evaluate`` when the stage produced a
model. It returns the stage's reference as a plain dict, so the same flow works as an inline subflow and
as a deployment run (issue 5's ``dispatch="deployments"``), where only store references cross processes.
"""

from __future__ import annotations

from typing import Any, Callable

from prefect import flow

from flows.report import MODEL_STAGES
from grpo_core.config import STAGES, PipelineConfig
from tasks._common import StageFailed, cached, stage_task
from tasks.cold_start_sft import cold_start_sft
from tasks.evaluate import evaluate
from tasks.final_rl import final_rl
from tasks.grpo_train import grpo_train
from tasks.prepare_data import prepare_data
from tasks.rejection_sample import rejection_sample
from tasks.sft_consolidate import sft_consolidate, upstream as consolidate_upstream
from tasks.store import StageRef, Store

TASKS: dict[str, Any] = {
    "prepare_data": prepare_data,
    "cold_start_sft": cold_start_sft,
    "grpo_train": grpo_train,
    "rejection_sample": rejection_sample,
    "sft_consolidate": sft_consolidate,
    "final_rl": final_rl,
}
RUN_CONFIG = "config.json"


def upstream(stage: str, config: PipelineConfig) -> list[str]:
    """The stages whose committed outputs ``stage`` reads."""
    if stage == "sft_consolidate":
        return consolidate_upstream(config)
    return {"prepare_data": [], "cold_start_sft": ["prepare_data"], "grpo_train": ["prepare_data", "cold_start_sft"],
            "rejection_sample": ["prepare_data", "grpo_train"],
            "final_rl": ["prepare_data", "sft_consolidate"]}[stage]


def committed(store: Store, run: str, stage: str) -> StageRef:
    ref = store.latest(run, stage)
    if ref is None:
        raise StageFailed(f"run {run!r} has no committed {stage} output in {store.url}; run it first "
                          f"(`r1 stage {stage} --run {run}` or `r1 run --run {run}`)")
    return ref


@stage_task("reuse")
def reuse(run: str, stage: str, store: str) -> StageRef:
    """An upstream stage the caller chose not to run: its newest committed output, in a Cached state."""
    return cached(committed(Store(store), run, stage), "not selected to run; reusing the committed output")


def resolve_config(config: PipelineConfig | dict[str, Any] | None, run: str, store: Store) -> PipelineConfig:
    """The given config, else the one the run was started with (saved in the store)."""
    if config is not None:
        return config if isinstance(config, PipelineConfig) else PipelineConfig.model_validate(config)
    saved = store.read_run_file(run, RUN_CONFIG)
    if saved is None:
        raise StageFailed(f"run {run!r} has no saved config in {store.url}; pass a config (-c FILE)")
    return PipelineConfig.model_validate(saved["config"])


def run_stage(stage: str, run: str, config: PipelineConfig | dict[str, Any] | None = None, store: str | None = None,
              inputs: dict[str, Any] | None = None, force: bool = True) -> dict[str, Any]:
    """The body of every stage flow: inputs from the caller or the store, the task, then evaluation."""
    st = Store(store)
    cfg = resolve_config(config, run, st)
    given = {k: v if isinstance(v, StageRef) else StageRef.from_dict(v) for k, v in (inputs or {}).items()}
    refs = {name: given.get(name) or committed(st, run, name) for name in upstream(stage, cfg)}
    task = TASKS[stage].with_options(retries=cfg.run.retries, retry_delay_seconds=cfg.run.retry_delay_seconds)
    ref = call_task(task, cfg, run, st.url, refs, force)
    if stage in MODEL_STAGES:
        data = refs["prepare_data"]  # every model stage reads prepare_data (``upstream``)
        ref = call_task(evaluate.with_options(retries=cfg.run.retries), cfg, run, st.url, ref, data, force)
    return ref.to_dict()


def call_task(task: Any, *args: Any) -> StageRef:
    """Run a stage task and return its StageRef, whether it ran or ended ``Cached`` (a task that returns a
    state hands that state, not its data, to a plain call); a failure raises the task's exception."""
    return task(*args, return_state=True).result()


def _flow(stage: str) -> Callable[..., Any]:
    return flow(name=stage.replace("_", "-"), flow_run_name="{run}-" + stage.replace("_", "-"),
                log_prints=True, validate_parameters=True)


@_flow("prepare_data")
def prepare_data_flow(run: str, config: dict[str, Any] | None = None, store: str | None = None,
                      inputs: dict[str, dict[str, Any]] | None = None, force: bool = True) -> dict[str, Any]:
    return run_stage("prepare_data", run, config, store, inputs, force)


@_flow("cold_start_sft")
def cold_start_sft_flow(run: str, config: dict[str, Any] | None = None, store: str | None = None,
                        inputs: dict[str, dict[str, Any]] | None = None, force: bool = True) -> dict[str, Any]:
    return run_stage("cold_start_sft", run, config, store, inputs, force)


@_flow("grpo_train")
def grpo_train_flow(run: str, config: dict[str, Any] | None = None, store: str | None = None,
                    inputs: dict[str, dict[str, Any]] | None = None, force: bool = True) -> dict[str, Any]:
    return run_stage("grpo_train", run, config, store, inputs, force)


@_flow("rejection_sample")
def rejection_sample_flow(run: str, config: dict[str, Any] | None = None, store: str | None = None,
                          inputs: dict[str, dict[str, Any]] | None = None, force: bool = True) -> dict[str, Any]:
    return run_stage("rejection_sample", run, config, store, inputs, force)


@_flow("sft_consolidate")
def sft_consolidate_flow(run: str, config: dict[str, Any] | None = None, store: str | None = None,
                         inputs: dict[str, dict[str, Any]] | None = None, force: bool = True) -> dict[str, Any]:
    return run_stage("sft_consolidate", run, config, store, inputs, force)


@_flow("final_rl")
def final_rl_flow(run: str, config: dict[str, Any] | None = None, store: str | None = None,
                  inputs: dict[str, dict[str, Any]] | None = None, force: bool = True) -> dict[str, Any]:
    return run_stage("final_rl", run, config, store, inputs, force)


STAGE_FLOWS = {
    "prepare_data": prepare_data_flow,
    "cold_start_sft": cold_start_sft_flow,
    "grpo_train": grpo_train_flow,
    "rejection_sample": rejection_sample_flow,
    "sft_consolidate": sft_consolidate_flow,
    "final_rl": final_rl_flow,
}
assert tuple(STAGE_FLOWS) == STAGES
