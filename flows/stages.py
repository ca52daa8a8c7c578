"""One Prefect flow per stage of the stage table, so any stage can be run, rerun or deployed on its own.

    r1 stage grpo_train --run NAME        (the CLI; or stage_flow("grpo_train")(run="NAME") from Python)

A stage flow reads its upstream inputs from the store (the current committed output of each upstream
stage, tasks/storage/lineage.py) unless the caller passes them, runs the stage's task, then ``evaluate`` when the stage makes a
model. It returns the stage's reference as a plain dict, so the same flow works as an inline subflow and
as a deployment run, where only store references cross processes. The flows are made from the table
(``tasks/config/stages.py``) on first use; ``flows/stages.py:<stage>_flow`` is each one's deployment entrypoint.
"""

from __future__ import annotations

from typing import Any

from prefect import Flow, flow

from tasks.config.pipeline import PipelineConfig, check_run_name, load_config
from tasks.config.stages import Stage, evaluation, get_stage, stage_names
from tasks.runner.common import StageFailed, cached, configure_stage_logging, stage_task_options
from tasks.runner.launch import stop_children
from tasks.storage import lineage
from tasks.storage.lease import fenced_as
from tasks.storage.manifest import StageRef
from tasks.storage.store import Store

RUN_CONFIG = "config.json"
_FLOWS: dict[str, Flow] = {}


def committed(store: Store, run: str, stage: str) -> StageRef:
    """The output of ``stage`` the run stands on now (tasks/storage/lineage.py), or a StageFailed saying how to make one."""
    ref = lineage.current(store, run, stage)
    if ref is None:
        raise StageFailed(f"run {run!r} has no committed {stage} output in {store.url}; run it first "
                          f"(`r1 stage {stage} --run {run}` or `r1 run --run {run}`)")
    return ref


def gather_inputs(entry: Stage, config: PipelineConfig, store: Store, run: str,
                  given: dict[str, StageRef]) -> dict[str, StageRef]:
    """The outputs ``entry`` reads under ``config`` (``Stage.inputs``): each the one ``given``, else the one the run
    stands on now; one of the entry's ``optional_inputs`` the run has none of yet is left out (evaluation's reward
    model, before the reward_model stage has run), any other missing one is a StageFailed saying how to make it."""
    refs = {}
    for name in entry.inputs(config):
        ref = given.get(name) or (lineage.current(store, run, name) if name in entry.optional_inputs
                                  else committed(store, run, name))
        if ref is not None:
            refs[name] = ref
    return refs


@stage_task_options("reuse")
def reuse(run: str, stage: str, store: str) -> StageRef:
    """An upstream stage the caller chose not to run: its current committed output, in a Cached state."""
    return cached(committed(Store(store), run, stage), "not selected to run; reusing the committed output")


def record_run_config(store: Store, run: str, config: PipelineConfig) -> None:
    """Save ``config`` as ``run``'s config (what ``r1 stage`` without -c, ``r1 eval`` and ``r1 status`` read back):
    ``r1 run`` records the config it runs at every start, ``r1 stage -c FILE`` too (the newest one wins)."""
    store.write_run_file(run, RUN_CONFIG, {"config": config.model_dump(mode="json")})


def resolve_config(config: PipelineConfig | None, config_path: str | None, run: str, store: Store) -> PipelineConfig:
    """The given config, else the file at ``config_path``, else the one the run was started with (saved in
    the store)."""
    if config is not None:
        return config
    if config_path is not None:
        return load_config(config_path)
    saved = store.read_run_file(run, RUN_CONFIG)
    if saved is None:
        raise StageFailed(f"run {run!r} has no saved config in {store.url}; pass a config (-c FILE)")
    return PipelineConfig.model_validate(saved["config"])


def run_stage(stage: str, run: str, config: PipelineConfig | None = None, config_path: str | None = None,
              store: str | None = None, inputs: dict[str, Any] | None = None, force: bool = True,
              lease_owner: str | None = None) -> dict[str, Any]:
    """The body of every stage flow: inputs from the caller or the store, the task, then evaluation.
    ``lease_owner``: the lease token of the pipeline that dispatched this stage to a worker; its commits are then
    refused once another writer holds the run, and its training child stopped (``tasks.storage.lease.fenced_as``)."""
    if lease_owner:  # watched: a takeover stops the training child within a heartbeat, not at the next commit
        with fenced_as(Store(store), run, lease_owner, on_lost=stop_children):
            return run_stage(stage, run, config, config_path, store, inputs, force)
    configure_stage_logging()  # a deployment run's process: no transformers bars in the log
    entry = get_stage(stage)
    check_run_name(run)
    st = Store(store)
    cfg = resolve_config(config, config_path, run, st)
    if not entry.enabled(cfg):
        raise StageFailed(f"stage {stage} is optional and this run's config does not enable it "
                         f"(add a `{stage}:` section to the config)")
    given = {k: v if isinstance(v, StageRef) else StageRef.from_dict(v) for k, v in (inputs or {}).items()}
    refs = gather_inputs(entry, cfg, st, run, given)
    task = entry.task.with_options(retries=cfg.run.retries, retry_delay_seconds=cfg.run.retry_delay_seconds)
    ref = call_task(task, cfg, run, st.url, refs, force)
    lineage.record(st, ref)  # built or reused, this output is what the run stands on now
    if entry.makes_model:  # evaluation reads what its entry names: those this stage read, else the run's current ones
        evaluated = gather_inputs(evaluation(), cfg, st, run, refs)
        call_task(evaluation().task.with_options(retries=cfg.run.retries), cfg, run, st.url, ref, evaluated, force)
    return ref.to_dict()


def call_task(task: Any, *args: Any) -> StageRef:
    """Run a stage task and return its StageRef, whether it ran or ended ``Cached`` (a task that returns a
    state hands that state, not its data, to a plain call); a failure raises the task's exception."""
    return task(*args, return_state=True).result()


def stage_flow(stage: str) -> Flow:
    """The flow of ``stage`` (named as the stage, dashes for underscores), made once."""
    if stage not in _FLOWS:
        entry = get_stage(stage)

        def body(run: str, config: PipelineConfig | None = None, config_path: str | None = None,
                 store: str | None = None, inputs: dict[str, dict[str, Any]] | None = None,
                 force: bool = True, lease_owner: str | None = None) -> dict[str, Any]:
            return run_stage(stage, run, config, config_path, store, inputs, force, lease_owner)

        body.__name__ = f"{stage}_flow"
        _FLOWS[stage] = flow(body, name=entry.flow_name, flow_run_name="{run}-" + entry.flow_name,
                             description=entry.description, log_prints=True, validate_parameters=True)
    return _FLOWS[stage]


def __getattr__(name: str) -> Flow:
    """``flows.stages.grpo_train_flow`` and friends: the deployments' entrypoints."""
    if name.endswith("_flow") and name.removesuffix("_flow") in stage_names():
        return stage_flow(name.removesuffix("_flow"))
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
