"""The DeepSeek-R1 recipe as one Prefect flow: the stage table's stages in order, each handed the
references of the stages it reads.

    r1 run                                   (embedded default: tiny model, built-in task, CPU)
    r1 run -c configs/qwen2.5-0.5b-gsm8k.yaml --run gsm8k-1 --store s3://bucket/r1
    prefect deployment run 'r1-pipeline/cpu' -p config_path=configs/qwen2.5-0.5b-gsm8k.yaml -p run_name=x

A stage whose committed output already matches its config fingerprint and inputs is reused (the task
ends ``Cached``). ``from_stage`` reruns that stage and every later one, reusing the committed outputs
before it; ``stages`` runs only the named stages and reuses the others. ``dispatch="inline"`` runs each
stage flow as a subflow in this process; ``"deployments"`` runs each with ``run_deployment`` on its work
pool (flows/dispatch.py), passing only the config and store references.
"""

from __future__ import annotations

import datetime as _dt
import secrets
from dataclasses import dataclass, field
from typing import Any, Literal

from prefect import flow

from flows import dispatch
from flows.report import write_report
from flows.stages import call_task, record_run_config, reuse, stage_flow
from tasks.config.pipeline import PipelineConfig, check_run_name, load_config
from tasks.config.stages import Stage, all_stages, get_stage, stage_names
from tasks.storage.lease import held_owner
from tasks.storage.manifest import StageRef
from tasks.storage.store import Store

Dispatch = Literal["inline", "deployments"]


def new_run_name() -> str:
    return "r1-" + _dt.datetime.now(_dt.timezone.utc).strftime("%Y%m%d-%H%M%S") + "-" + secrets.token_hex(2)


@dataclass
class Dispatcher:
    """Runs, or reuses, one stage at a time in table order, handing each the refs of its upstream stages."""

    config: PipelineConfig
    run: str
    store: str
    selected: list[str]
    forced: list[str]
    dispatch: Dispatch = "inline"
    refs: dict[str, StageRef] = field(default_factory=dict)

    @classmethod
    def plan(cls, config: PipelineConfig, run: str, store: str, stages: list[str] | None, from_stage: str | None,
             dispatch: Dispatch) -> "Dispatcher":
        for name in [*(stages or []), *([from_stage] if from_stage else [])]:
            get_stage(name)  # UnknownStage lists the stages
        order = stage_names()
        selected = list(stages or order)
        forced: list[str] = []
        if from_stage:
            selected = [s for s in selected if order.index(s) >= order.index(from_stage)]
            forced = list(selected)
        return cls(config, run, store, selected, forced, dispatch)

    def __call__(self, stage: Stage) -> StageRef | None:
        if not stage.enabled(self.config):  # an optional stage this config does not run (reward_model)
            return None
        if stage.name not in self.selected:
            ref = call_task(reuse.with_options(name=f"reuse-{stage.name}"), self.run, stage.name, self.store)
        else:
            ref = self.run_stage(stage, {name: self.refs[name] for name in stage.inputs(self.config)})
        self.refs[stage.name] = ref
        return ref

    def run_stage(self, stage: Stage, inputs: dict[str, StageRef]) -> StageRef:
        params = {"run": self.run, "config": self.config, "store": self.store,
                  "inputs": {k: v.to_dict() for k, v in inputs.items()}, "force": stage.name in self.forced}
        if self.dispatch == "inline":
            return StageRef.from_dict(stage_flow(stage.name)(**params), self.store)

        owner = held_owner(Store(self.store), self.run)  # the worker's commits are fenced on this run's lease
        return dispatch.run_stage_deployment(stage.name, {**params, "config": self.config.model_dump(mode="json"),
                                                          **({"lease_owner": owner} if owner else {})})


def pipeline_config(config: PipelineConfig | None, config_path: str | None) -> PipelineConfig:
    """``config`` when given (parsed once by the caller), else the YAML at ``config_path``, else the embedded
    default: with neither, the pipeline deployment runs exactly what ``r1 run`` runs."""
    return config if config is not None else load_config(config_path)


@flow(name="r1-pipeline", flow_run_name="{run_name}", log_prints=True)
def r1_pipeline(config_path: str | None = None, run_name: str | None = None, stages: list[str] | None = None,
                from_stage: str | None = None, store: str | None = None, dispatch: Dispatch = "inline",
                config: PipelineConfig | None = None) -> dict[str, Any]:
    """Run the R1 recipe on ``config`` (already parsed), else the YAML file at ``config_path``, else the
    embedded default (``configs/tiny-cpu.yaml``, what ``r1 run`` uses); returns
    ``{"run", "store", "stages": {stage: ref}, "report": uri}``."""
    cfg = pipeline_config(config, config_path)
    run = check_run_name(run_name) if run_name else new_run_name()
    st = Store(store)
    record_run_config(st, run, cfg)
    stage = Dispatcher.plan(cfg, run, st.url, stages, from_stage, dispatch)

    for entry in all_stages():  # prepare_data, cold_start_sft, grpo_train, rejection_sample, sft_consolidate, final_rl
        stage(entry)

    report = write_report(st, run)
    return {"run": run, "store": st.url, "stages": {k: v.to_dict() for k, v in stage.refs.items()},
            "report": report.uri}
