"""The part the training stages share: run the trainer with store checkpoints, then commit the model.

Each training stage's body only picks its inputs (which rows, which starting model) and calls ``train_and_commit``,
which trains with its table entry's kind and section. The trackers of the section's ``report_to`` (W&B, MLflow,
Trackio) get one run per stage, grouped by the pipeline run, with the lineage (run, stage, version, fingerprint,
parents) as metadata (``tracking_info``); their files are committed with the stage as ``trackers/`` unless
``run.tracking_dir`` puts them elsewhere. A GRPO section's completion tables are committed as ``completions.jsonl``.
The checkpoint key is the stage fingerprint, so a retry resumes only checkpoints
written under the same config and inputs; after the commit the stage's checkpoints are deleted (the
committed model replaces them, and a forced rerun must start from scratch, not from the last one).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Callable

from grpo_core.config import EvalConfig, OptimConfig, TrackingInfo
from tasks.config.training_spec import TRAINERS, TrainerKind, TrainingSpec, trainer_config
from tasks.runner.common import Progress, StageContext, StageFailed, commit_stage, logger, resolve_reward_models
from tasks.runner.monitor import MONITOR_FILE, publish_alarm, read_record
from tasks.runner.worker import run_training
from tasks.storage.manifest import StageRef
from tasks.storage.store import new_version


def train_and_commit(ctx: StageContext, *, model_path: str, rows_path: Path, parents: dict[str, StageRef], fp: str,
                     extra_metrics: dict[str, Any] | None = None, eval_rows_path: Path | None = None,
                     eval_config: EvalConfig | None = None, extra_files: dict[str, Path] | None = None,
                     accept: Callable[[dict[str, Any]], None] | None = None) -> StageRef:
    """Train the stage's entry's kind on its section (resuming from the store's newest checkpoint for ``fp``),
    upload the final model (and ``extra_files``, output name -> local file, e.g. the training rows), commit.
    ``accept`` sees the trainer's metrics before anything is committed and raises ``StageFailed`` to refuse the
    model (its checkpoints stay, so a rerun with the same config resumes at the last step).

    The kind is grpo, sft or reward (``eval_rows_path``: the reward model's held-out pairs, or GRPO's held-out
    prompts for ``eval_steps`` scored as ``eval_config`` says)."""
    kind: TrainerKind = ctx.entry.kind  # type: ignore[assignment] - checked just below
    if not ctx.entry.trains:
        raise StageFailed(f"{ctx.stage}: train_and_commit trains a stage of a training kind ({', '.join(TRAINERS)}); "
                          f"its entry's kind is {kind!r}")
    section: OptimConfig = ctx.section
    log = logger()
    trainer_section = resolve_reward_models(ctx, section, parents)  # `model: reward_model` -> the fetched folder
    out = ctx.work / "train" / "out"
    version = new_version()  # drawn now so the trackers' lineage names the version this attempt commits
    spec = TrainingSpec(
        kind=kind, config=trainer_config(kind, trainer_section, torch_num_threads=ctx.config.run.torch_num_threads),
        model_path=str(model_path), rows_path=str(rows_path), output_dir=str(out), store=ctx.store.url, run=ctx.run,
        stage=ctx.stage, key=fp, keep=ctx.config.run.keep_checkpoints,
        eval_rows_path=str(eval_rows_path) if eval_rows_path else None, eval_config=eval_config,
        tracking=tracking_info(ctx, parents, fp, version))
    progress = Progress(ctx.run, ctx.stage)

    def on_event(event: dict[str, Any]) -> None:
        if event["event"] == "step":
            progress.update(event["step"], event["max_steps"], event.get("metrics"))
        elif event["event"] == "checkpoint":
            log.info(f"{ctx.stage}: checkpoint at step {event['step']} stored at {event['uri']}")
        elif event["event"] == "resume":
            log.info(f"{ctx.stage}: resuming from the store's checkpoint at step {event['step']} ({event['uri']})")
        elif event["event"] == "alarm":  # the reward-hacking monitor (tasks/runner/monitor.py)
            publish_alarm(ctx.run, ctx.stage, event, log)

    inputs = {key: {"ref": ctx.fetched[path][0].to_dict(), "name": ctx.fetched[path][1]}  # what other nodes fetch
              for key in ("model_path", "rows_path") if (path := getattr(spec, key)) in ctx.fetched}
    result = run_training(spec, isolation=ctx.config.run.isolation, on_event=on_event, inputs=inputs)
    if accept is not None:
        accept(result["metrics"])
    final = Path(result["metrics"].get("final_path") or out / "final")
    history = out / "metrics.jsonl"  # the trainer's step history, complete across resumes
    with ctx.begin(version) as writer:
        writer.put_dir(final, "model")
        for name, path in (extra_files or {}).items():
            writer.put_file(path, name)
        if (out / "trackers").is_dir() and spec.tracking.dir is None:  # the trackers' files, for `wandb sync` etc.
            writer.put_dir(out / "trackers", "trackers")
        if (out / "completions.jsonl").exists():
            writer.put_file(out / "completions.jsonl", "completions.jsonl")
        steps_logged = 0
        if history.exists():
            writer.put_file(history, "metrics.jsonl")
            steps_logged = sum(1 for line in history.read_text().splitlines() if line.strip())
        metrics = {k: v for k, v in result["metrics"].items() if k != "final_path"}
        metrics.update(extra_metrics or {})
        extra: dict[str, Any] = {"training": {"kind": kind, "resumed_from_step": result["resumed_from"],
                                              "steps_logged": steps_logged}}
        if (monitor := read_record(out)) is not None:  # eval_steps' reward-hacking monitor and checkpoint selection
            writer.put_file(out / MONITOR_FILE, MONITOR_FILE)
            extra["monitor"] = monitor
        ref = commit_stage(ctx, writer, fp=fp, parents=parents, metrics=metrics, extra=extra)
    ctx.store.remove(ctx.store.checkpoint_dir(ctx.run, ctx.stage, fp))
    return ref


def heldout_inputs(ctx: StageContext, data: StageRef) -> dict[str, Any]:
    """A GRPO stage's ``eval_steps`` inputs: prepare_data's held-out prompts and the ``evaluate`` section that scores
    them (its reward model and benchmarks left out: evaluation during RL scores verifiable rows only); {} without
    ``eval_steps`` in the stage's section."""
    if getattr(ctx.section, "eval_steps", None) is None:
        return {}
    scoring = ctx.config.evaluate.model_copy(update={"rm_reward": None, "benchmarks": []})
    return {"eval_rows_path": ctx.fetch(data, "eval.parquet"), "eval_config": scoring}


def tracking_info(ctx: StageContext, parents: dict[str, StageRef], fp: str, version: str) -> TrackingInfo:
    """Who this training stage is for its trackers: a run named after the stage in the pipeline run's group, the
    lineage as metadata, a key stable across retries (same fingerprint), files where ``run.tracking_dir`` says."""
    lineage = {"run": ctx.run, "stage": ctx.stage, "version": version, "fingerprint": fp,
               "parents": {name: {"stage": ref.stage, "version": ref.version, "fingerprint": ref.fingerprint}
                           for name, ref in sorted(parents.items())}}
    return TrackingInfo(group=ctx.run, name=ctx.stage, run_key=f"{ctx.run}-{ctx.stage}-{fp[:12]}", metadata=lineage,
                        dir=ctx.config.run.tracking_dir)


def read_history(store: Any, ref: StageRef) -> list[dict[str, Any]]:
    """The per-step metrics a training stage committed (``metrics.jsonl``, checked against its manifest)."""
    try:
        text = store.read_output(ref, "metrics.jsonl").decode()
    except FileNotFoundError:
        return []
    return [json.loads(line) for line in text.splitlines() if line.strip()]
