"""Optional stage reward_model: a reward model trained on prepare_data's preference pairs (grpo_core.trainer.reward_model),
and how later stages name it as a reward.

Runs only when the config has a ``reward_model:`` section (the stage table's ``when``). Reads
``preferences.parquet`` (columns prompt, chosen, rejected, source[, margin]) and, when prepare_data wrote one,
``preferences_eval.parquet`` as the held-out pairs (else ``eval_fraction`` of the pairs is held out). The
backbone is the base model (the tiny one prepare_data builds, for the embedded default), the cold-start SFT
model (``init_from: cold_start_sft``) or ``model_name_or_path``, with a fresh score head. Output: ``model/``
(with ``reward_stats.json``) and ``metrics.jsonl``; the manifest's metrics hold ``eval/pair_accuracy``.

A GRPO stage names the output as ``reward_funcs: [{reward_model: {model: reward_model}}]``:
``reward_model_upstream`` adds the stage to its inputs (so its fingerprint covers the reward model's version)
and ``resolve_reward_models`` puts the fetched folder in place of the stage name before training.
"""

from __future__ import annotations

from typing import Any, Iterator

from pydantic import BaseModel

from grpo_core.config import REWARD_MODEL_STAGE, RewardModelSpec
from tasks.common import StageContext, StageFailed, stage_task
from tasks.config import PipelineConfig
from tasks.manifest import StageRef
from tasks.training import train_and_commit

PREFERENCES = "preferences.parquet"
PREFERENCES_EVAL = "preferences_eval.parquet"


def enabled(config: PipelineConfig) -> bool:
    """The stage runs only when the config has a ``reward_model:`` section."""
    return config.reward_model is not None


def upstream(config: PipelineConfig) -> tuple[str, ...]:
    """prepare_data (pairs, base model), and cold_start_sft when the backbone is the SFT model."""
    section = config.reward_model
    from_sft = section is not None and section.model_name_or_path is None and section.init_from == "cold_start_sft"
    return ("prepare_data", "cold_start_sft") if from_sft else ("prepare_data",)


@stage_task(REWARD_MODEL_STAGE, section="reward_model")
def reward_model(ctx: StageContext, parents: dict[str, StageRef], fp: str) -> StageRef:
    section = ctx.config.reward_model
    if section is None:
        raise StageFailed("reward_model: this config has no `reward_model:` section, so the stage has nothing to do")
    data = parents["prepare_data"]
    files = ctx.store.manifest(data).get("files") or {}
    if PREFERENCES not in files:
        raise StageFailed(f"reward_model: prepare_data output {data.uri} has no {PREFERENCES}; the reward model "
                          "needs preference pairs (prompt, chosen, rejected, source): configure preference sources "
                          "in the data section, or remove the `reward_model:` section")
    if section.model_name_or_path is not None:
        backbone = section.model_name_or_path
    elif section.init_from == "cold_start_sft":
        backbone = str(ctx.fetch(parents["cold_start_sft"], "model"))
    else:
        backbone = ctx.base_model(data)
    eval_path = ctx.fetch(data, PREFERENCES_EVAL) if PREFERENCES_EVAL in files else None
    return train_and_commit(ctx, kind="reward", section=section, model_path=backbone,
                            rows_path=ctx.fetch(data, PREFERENCES), eval_rows_path=eval_path, parents=parents, fp=fp)


# ------------------------------------------------------------- naming the stage's model in a GRPO stage's rewards
# The helpers walk a config section's fields (lists and nested models included), so an entry counts wherever it
# sits: GRPOConfig.reward_funcs, a mixture source's reward_funcs, an evaluation's reward-model field.

def _is_stage_reference(value: Any) -> bool:
    return isinstance(value, RewardModelSpec) and value.model == REWARD_MODEL_STAGE


def walk_fields(value: Any) -> Iterator[Any]:
    """``value`` and everything under it: a model's fields, a list's items (the memory planner finds reward
    models and judges with it too)."""
    yield value
    if isinstance(value, BaseModel):
        for name in type(value).model_fields:
            yield from walk_fields(getattr(value, name))
    elif isinstance(value, (list, tuple)):
        for item in value:
            yield from walk_fields(item)


def _replace(value: Any, local: str) -> Any:
    """``value`` with stage references replaced; only the fields that change are updated, since ``model_copy``
    marks what it updates as set and the trainer's spec carries the set fields (tasks.training_spec)."""
    if _is_stage_reference(value):
        return value.model_copy(update={"model": local})
    if isinstance(value, BaseModel):
        changed = {name: new for name in type(value).model_fields
                   if (new := _replace(old := getattr(value, name), local)) is not old}
        return value.model_copy(update=changed) if changed else value
    if isinstance(value, list):
        items = [_replace(item, local) for item in value]
        return items if any(new is not old for new, old in zip(items, value)) else value
    return value


def uses_reward_model_stage(section: BaseModel) -> bool:
    """Whether ``section`` holds an entry ``{reward_model: {model: reward_model}}`` anywhere."""
    return any(_is_stage_reference(v) for v in walk_fields(section))


def reward_model_upstream(section: BaseModel) -> tuple[str, ...]:
    """``("reward_model",)`` when ``section`` names the stage's model as a reward, else ``()``."""
    return (REWARD_MODEL_STAGE,) if uses_reward_model_stage(section) else ()


def resolve_reward_models(ctx: StageContext, section: BaseModel, parents: dict[str, StageRef]) -> BaseModel:
    """A copy of ``section`` whose ``model: reward_model`` entries (``reward_funcs``, ``sources[*].reward_funcs``,
    ``rm_reward``) name the local folder of the committed reward_model output in ``parents`` (fetched and checked
    against its manifest)."""
    if not uses_reward_model_stage(section):
        return section
    if REWARD_MODEL_STAGE not in parents:
        raise StageFailed(f"{ctx.stage}: a reward names the reward_model stage but it is not among this stage's "
                          "inputs; add reward_model_upstream(section) to the stage's upstream in tasks/stages.py")
    return _replace(section, str(ctx.fetch(parents[REWARD_MODEL_STAGE], "model")))
