"""Where a run stands: each stage's current committed output (tasks/storage/lineage.py), its evaluation, and its state.

    r1 status NAME [--json]        (``stage_status``; the report's "Stages" section reads the same)

A stage is completed (a committed output), stale (its current output was built, directly or through its parents'
outputs, on an upstream output that is no longer current: the upstream stage was rerun since; ``stale_upstream``
names it), incomplete (an uncommitted version folder or checkpoint),
pending (nothing yet) or skipped (an optional stage the run's saved config does not enable). A model
stage's evaluation is the newest committed ``evaluate/{stage}`` output whose parent is that exact model.
"""

from __future__ import annotations

from typing import Any

from flows.stages import RUN_CONFIG
from tasks.config.pipeline import PipelineConfig
from tasks.config.stages import all_stages
from tasks.stages.evaluate import output_name as eval_output
from tasks.storage import lineage
from tasks.storage.manifest import StageRef
from tasks.storage.store import Store


def latest_refs(store: Store, run: str) -> dict[str, StageRef | None]:
    """Every stage's current committed output (None where there is none): what the run's last stage flows ran or
    reused, not the newest (a run switched from config A to B and back stands on A's outputs)."""
    return lineage.current_refs(store, run, [s.name for s in all_stages()])


def disabled_stages(store: Store, run: str) -> set[str]:
    """The optional stages the run's saved config does not enable (none when it has no readable config)."""

    saved = store.read_run_file(run, RUN_CONFIG)
    try:
        config = PipelineConfig.model_validate(saved["config"]) if saved else None
    except Exception:  # noqa: BLE001 - a config this code cannot read: show every stage as before
        return set()
    return {s.name for s in all_stages() if config is not None and not s.enabled(config)}


def evaluation_of(store: Store, ref: StageRef) -> StageRef | None:
    """The newest committed evaluation whose parent is exactly the model output ``ref``."""
    return store.latest(ref.run, eval_output(ref.stage),
                        where=lambda m: (m.get("parents") or {}).get("model", {}).get("version") == ref.version)


def latest_evaluations(store: Store, refs: dict[str, StageRef | None]) -> dict[str, StageRef | None]:
    """The evaluation of each committed model stage in ``refs`` (``evaluation_of``), read once per stage."""
    return {s.name: evaluation_of(store, refs[s.name]) for s in all_stages() if s.makes_model and refs[s.name]}


def stage_status(store: Store, run: str, refs: dict[str, StageRef | None] | None = None,
                 evaluations: dict[str, StageRef | None] | None = None) -> dict[str, Any]:
    """``{"run", "stages": {stage: {"state", "uri", "path", "metrics"}}}`` (state: completed | stale (with
    ``stale_upstream``: the upstream stages, anywhere in its ancestry, rerun since) | incomplete | pending | skipped (an optional stage the run's config does not enable); ``path`` store-relative, ``uri`` resolved in ``store``); a model stage's metrics include its
    evaluation's (``eval/...``), with ``eval_uri`` and ``eval_path``.

    ``refs``/``evaluations``: what the caller has already read (``latest_refs``, ``latest_evaluations``)."""
    refs = latest_refs(store, run) if refs is None else refs
    evaluations = latest_evaluations(store, refs) if evaluations is None else evaluations
    stages: dict[str, Any] = {}
    skipped = disabled_stages(store, run)
    stale = lineage.stale_parents(store, refs)
    for entry in all_stages():
        stage, ref = entry.name, refs[entry.name]
        if ref is None and stage in skipped:  # an optional stage this run's config does not run
            stages[stage] = {"state": "skipped", "uri": None, "path": None, "metrics": {}}
        elif ref is not None:
            stages[stage] = {"state": "stale" if stage in stale else "completed", "uri": ref.uri, "path": ref.path,
                             "metrics": dict(ref.metrics)}
            if stage in stale:
                stages[stage]["stale_upstream"] = stale[stage]
            evaluation = evaluations.get(stage)
            if evaluation is not None:
                stages[stage]["metrics"].update(evaluation.metrics)
                stages[stage].update(eval_uri=evaluation.uri, eval_path=evaluation.path)
        else:
            pending = store.uncommitted(run, stage)
            stages[stage] = {"state": "incomplete" if pending else "pending", "uri": None, "path": None,
                             "metrics": {}}
    return {"run": run, "stages": stages}
