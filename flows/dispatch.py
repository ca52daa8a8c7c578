"""``dispatch="deployments"``: run one stage flow as a deployment run on its work pool and wait for it.

The stage's deployment is the one ``r1 deploy`` registers for ``flows/stages.py:<stage>_flow`` on the
stage's pool (``prepare-data/cpu``, ``grpo-train/gpu``, ...: flow name / pool kind, from the stage table). Only the config and store references travel as
parameters; the child commits its output to the store, and the parent collects that committed reference
from the store (the one place both can read: the child may run on another machine, and Prefect results
are not persisted by default). A child that ends in any state but Completed raises ``StageRunFailed``
naming the run and how to retry it.

Crashed runs: a stage whose worker or pod dies is marked Crashed by Prefect, and flow-level retries do
not apply to Crashed runs (PrefectHQ/prefect#10211). Recover with either
  - ``prefect flow-run retry <id>``: the stage reruns; its training resumes from the store's newest
    checkpoint, or
  - the pipeline again with the same run name: committed stages are reused, the crashed one resumes.
"""

from __future__ import annotations

import os
from typing import Any

from tasks.config.stages import all_stages
from tasks.storage import lineage
from tasks.storage.manifest import StageRef
from tasks.storage.store import Store


class StageRunFailed(RuntimeError):
    """A stage's deployment run ended Failed, Crashed or Cancelled."""


def stage_deployments() -> dict[str, str]:
    """stage -> ``flow-name/deployment-name`` as ``r1 deploy`` registers them (flows/deploy.py)."""
    return {s.name: f"{s.flow_name}/{s.pool}" for s in all_stages()}


def run_stage_deployment(stage: str, parameters: dict[str, Any], *, timeout: float | None = None) -> StageRef:
    """Run ``stage``'s deployment with ``parameters`` (run, config, store, inputs, force) and wait for it."""
    from prefect.deployments import run_deployment

    name = stage_deployments()[stage]
    poll = float(os.environ.get("R1_DISPATCH_POLL_SECONDS", "5"))
    flow_run = run_deployment(name, parameters=parameters, timeout=timeout, poll_interval=poll, as_subflow=True,
                              tags=["r1", f"run:{parameters['run']}"])
    state = flow_run.state
    if state is None or not state.is_completed():
        kind = state.type.value if state is not None else "UNKNOWN"
        hint = (" (its worker or pod died; flow retries do not apply to Crashed runs)" if kind == "CRASHED" else "")
        raise StageRunFailed(
            f"{stage}: deployment run {flow_run.name!r} ({flow_run.id}) of {name} ended {kind}{hint}: "
            f"{state.message if state else ''}\nRetry it with `prefect flow-run retry {flow_run.id}`, or rerun the "
            f"pipeline with run name {parameters['run']!r}: committed stages are reused and training resumes "
            f"from the store's checkpoints."
        )
    ref = lineage.current(Store(parameters.get("store")), parameters["run"], stage)  # the one its flow recorded
    if ref is None:
        raise StageRunFailed(f"{stage}: deployment run {flow_run.name!r} completed but committed nothing to the "
                             f"store {parameters.get('store')!r}; do the workers use the same R1_STORE?")
    return ref
