"""The DeepSeek-R1 recipe as one Prefect flow: six stages, each returning the reference the next consumes.

    r1 run                                   (embedded default: tiny model, built-in task, CPU)
    r1 run -c configs/qwen2.5-0.5b-gsm8k.yaml --run gsm8k-1 --store s3://bucket/r1

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

from flows.report import write_report
from flows.stages import RUN_CONFIG, STAGE_FLOWS, call_task, reuse
from grpo_core.config import STAGES, PipelineConfig
from tasks.store import StageRef, Store

Dispatch = Literal["inline", "deployments"]


def new_run_name() -> str:
    return "r1-" + _dt.datetime.now(_dt.timezone.utc).strftime("%Y%m%d-%H%M%S") + "-" + secrets.token_hex(2)


@dataclass
class Dispatcher:
    """Runs, or reuses, one stage; ``stage(name, **inputs)`` is what each line of the pipeline calls."""

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
            if name not in STAGES:
                raise ValueError(f"unknown stage {name!r}; stages are {', '.join(STAGES)}")
        selected = list(stages or STAGES)
        forced: list[str] = []
        if from_stage:
            selected = [s for s in selected if STAGES.index(s) >= STAGES.index(from_stage)]
            forced = list(selected)
        return cls(config, run, store, selected, forced, dispatch)

    def __call__(self, stage: str, **inputs: StageRef) -> StageRef:
        if stage not in self.selected:
            ref = call_task(reuse.with_options(name=f"reuse-{stage}"), self.run, stage, self.store)
        else:
            ref = self.run_stage(stage, inputs)
        self.refs[stage] = ref
        return ref

    def run_stage(self, stage: str, inputs: dict[str, StageRef]) -> StageRef:
        params = {"run": self.run, "config": self.config.model_dump(mode="json"), "store": self.store,
                  "inputs": {k: v.to_dict() for k, v in inputs.items()}, "force": stage in self.forced}
        if self.dispatch == "inline":
            return StageRef.from_dict(STAGE_FLOWS[stage](**params))
        from flows.dispatch import run_stage_deployment  # the stage's deployment on its pool (infra/prefect.yaml)

        return run_stage_deployment(stage, params)


@flow(name="r1-pipeline", flow_run_name="{run_name}", log_prints=True)
def r1_pipeline(config: dict[str, Any] | None = None, run_name: str | None = None, stages: list[str] | None = None,
                from_stage: str | None = None, store: str | None = None, dispatch: Dispatch = "inline") -> dict[str, Any]:
    """Run the R1 recipe; returns ``{"run", "store", "stages": {stage: ref}, "report": uri}``."""
    cfg = PipelineConfig.model_validate(config or {})
    run = run_name or new_run_name()
    st = Store(store)
    st.write_run_file(run, RUN_CONFIG, {"config": cfg.model_dump(mode="json")})
    stage = Dispatcher.plan(cfg, run, st.url, stages, from_stage, dispatch)

    data = stage("prepare_data")
    sft = stage("cold_start_sft", prepare_data=data)
    rl = stage("grpo_train", prepare_data=data, cold_start_sft=sft)
    samples = stage("rejection_sample", prepare_data=data, grpo_train=rl)
    consolidated = stage("sft_consolidate", prepare_data=data, rejection_sample=samples, cold_start_sft=sft,
                         grpo_train=rl)
    stage("final_rl", prepare_data=data, sft_consolidate=consolidated)

    report = write_report(st, run)
    return {"run": run, "store": st.url, "stages": {k: v.to_dict() for k, v in stage.refs.items()},
            "report": report.uri}
