"""Optional stage reward_model: a reward model trained on prepare_data's preference pairs (grpo_core.trainer.reward_model),
and how later stages name it as a reward.

Runs only when the config has a ``reward_model:`` section (the stage table's ``optional``). Reads
``preferences.parquet`` (columns prompt, chosen, rejected, source[, margin]) and, when prepare_data wrote one,
``preferences_eval.parquet`` as the held-out pairs (else ``eval_fraction`` of the pairs is held out). The
backbone is the base model (the tiny one prepare_data builds, for the embedded default), the cold-start SFT
model (``init_from: cold_start_sft``) or ``model_name_or_path``, with a fresh score head. Output: ``model/``
(with ``reward_stats.json``) and ``metrics.jsonl``; the manifest's metrics hold ``eval/pair_accuracy``. A model
whose held-out pair accuracy, on all pairs or on one source's, is below ``min_heldout_accuracy`` fails the stage
before anything is committed, so no later stage spends compute optimising against it.

A GRPO stage names the output as ``reward_funcs: [{reward_model: {model: reward_model}}]``: the stage table adds
the stage to its inputs (``Stage.inputs``, so its fingerprint covers the reward model's version) and
``tasks.runner.common.resolve_reward_models`` puts the fetched folder in place of the stage name before training.
"""

from __future__ import annotations

from typing import Any

from tasks.runner.common import StageContext, StageFailed, logger, stage_task
from tasks.runner.training import train_and_commit
from tasks.storage.manifest import StageRef

PREFERENCES = "preferences.parquet"
PREFERENCES_EVAL = "preferences_eval.parquet"


@stage_task
def reward_model(ctx: StageContext, parents: dict[str, StageRef], fp: str) -> StageRef:
    section = ctx.section
    if section is None:
        raise StageFailed(f"{ctx.stage}: this config has no `{ctx.entry.config_key}:` section, so the stage has "
                          "nothing to do")
    data = parents["prepare_data"]
    files = ctx.store.manifest(data).get("files") or {}
    if PREFERENCES not in files:
        raise StageFailed(f"{ctx.stage}: prepare_data output {data.uri} has no {PREFERENCES}; the reward model "
                          "needs preference pairs (prompt, chosen, rejected, source), which prepare_data writes for "
                          "the built-in general sources (data.builtin_general); for pairs of your own, train the "
                          "reward model from Python and name its folder in the reward entries "
                          f"(docs/recipes/reward-model.md), and remove the `{ctx.entry.config_key}:` section")
    if section.model_name_or_path is not None:
        backbone = section.model_name_or_path
    elif section.init_from == "base":
        backbone = ctx.base_model(data)
    else:  # a stage's model (the table's upstream reads it)
        backbone = str(ctx.fetch(parents[section.init_from], "model"))
    eval_path = ctx.fetch(data, PREFERENCES_EVAL) if PREFERENCES_EVAL in files else None
    return train_and_commit(ctx, model_path=backbone, rows_path=ctx.fetch(data, PREFERENCES), eval_rows_path=eval_path,
                            parents=parents, fp=fp, accept=lambda metrics: check_heldout_accuracy(ctx, metrics))


def check_heldout_accuracy(ctx: StageContext, metrics: dict[str, Any]) -> None:
    """Raise ``StageFailed`` naming each source (and "all pairs") whose held-out pair accuracy is below the
    section's ``min_heldout_accuracy``; a model with no held-out pairs passes with a warning."""
    section, key = ctx.section, ctx.entry.config_key
    minimum = section.min_heldout_accuracy
    if minimum is None:
        return
    if "eval/pair_accuracy" not in metrics:
        logger().warning(f"{ctx.stage}: no held-out pairs, so {key}.min_heldout_accuracy checked nothing")
        return
    scores = {"all pairs": metrics["eval/pair_accuracy"]}
    for name, value in metrics.items():  # eval/{source}/pair_accuracy
        parts = name.split("/")
        if len(parts) == 3 and parts[0] == "eval" and parts[2] == "pair_accuracy":
            scores[f"{parts[1]} pairs"] = value
    low = {name: value for name, value in scores.items() if value < minimum}
    if low:
        length = (f"{key}.max_steps, now {section.max_steps}" if section.max_steps is not None
                  else f"{key}.num_train_epochs, now {section.num_train_epochs}")
        raise StageFailed(
            f"{ctx.stage}: held-out pair accuracy below {key}.min_heldout_accuracy ({minimum}): "
            + ", ".join(f"{name} {value:.2f}" for name, value in low.items())
            + f" ({int(metrics.get('eval/num_pairs', 0))} held-out pairs in all). Final RL would optimise against a "
            f"model that misranks them: train it longer ({length}) or on more pairs, "
            f"or lower {key}.min_heldout_accuracy (null: no check). Nothing was committed.")
