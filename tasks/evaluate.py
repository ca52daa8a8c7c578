"""evaluate: score a stage's model on the held-out set; a committed output of its own.

Greedy accuracy, pass@1 over k samples, mean completion length, format rate and the rest of
grpo_core.evaluation's metrics. The output lives at ``{run}/evaluate/{stage}/{version}/`` with
``results.jsonl`` (per prompt) and a manifest whose parents are the model it scored and the eval set;
the scored stage's own manifest is never touched (a committed manifest is written once). The fingerprint
(eval config + model version + eval set version) makes a second evaluation of the same model a cache hit.
"""

from __future__ import annotations

from grpo_core.data import read_parquet
from tasks.common import StageContext, cached, commit_stage, fingerprint, logger, stage_task_options, write_jsonl
from tasks.manifest import StageRef

STAGE = "evaluate"


def output_name(stage: str) -> str:
    """Where the evaluations of ``stage``'s models are committed (a stage name for the store)."""
    return f"{STAGE}/{stage}"


@stage_task_options(STAGE)
def evaluate(config, run: str, store: str | None, model: StageRef, data: StageRef, force: bool = False,
             reward_model: StageRef | None = None) -> StageRef:
    """Evaluate the model committed as ``model`` on ``data``'s held-out rows (``eval.parquet``); general rows
    are scored by ``rm_reward``, which may name the run's ``reward_model`` output (then ``reward_model`` is it;
    a model evaluated before the reward model exists is evaluated without ``eval/rm_score``)."""
    from tasks.reward_model import resolve_reward_models, uses_reward_model_stage

    ctx = StageContext.open(config, run, store, output_name(model.stage))
    try:
        cfg = ctx.config.evaluate
        parents = {"model": model, "prepare_data": data}
        if uses_reward_model_stage(cfg):
            if reward_model is None:
                logger().info(f"evaluate {model.stage}: no reward_model output yet; evaluated without eval/rm_score")
                cfg = cfg.model_copy(update={"rm_reward": None})
            else:
                parents["reward_model"] = reward_model
        fp = fingerprint(STAGE, cfg, parents)
        if (ref := ctx.reuse(fp, force)) is not None:
            return cached(ref, "this model was already evaluated with this config")
        from grpo_core.evaluation import evaluate_with_config

        rows = read_parquet(ctx.fetch(data, "eval.parquet"))
        scoring = resolve_reward_models(ctx, cfg, parents)  # `model: reward_model` -> the fetched folder
        result = evaluate_with_config(scoring, str(ctx.fetch(model, "model")), rows, return_rows=True)
        results_path = write_jsonl(result.pop("rows"), ctx.work / "out" / "results.jsonl")
        metrics = {k: float(v) for k, v in result.items() if isinstance(v, (int, float))}
        with ctx.begin() as writer:
            writer.put_file(results_path, "results.jsonl")
            ref = commit_stage(ctx, writer, fp=fp, section=cfg, parents=parents, metrics=metrics)
        logger().info(f"evaluate {model.stage}: " + ", ".join(f"{k}={v:.4g}" for k, v in sorted(metrics.items())))
        return ref
    finally:
        ctx.cleanup()
