"""The config section types only the pipeline has (a stage's settings beyond grpo_core's trainer configs), and
the walk that finds a ``{reward_model: {model: reward_model}}`` entry in any section.

They sit apart from ``tasks/config/pipeline.py`` because the stage table (``tasks/config/stages.py``) names each stage's section
type and ``PipelineConfig`` is built from the table: the table imports these, ``tasks.config.pipeline`` imports the table.
"""

from __future__ import annotations

from typing import Any, Iterator, Literal

from pydantic import BaseModel, Field, model_validator

from grpo_core.config import REWARD_MODEL_STAGE, DatasetSource, RewardConfig, RewardModelSpec, SFTConfig


class ConsolidateConfig(SFTConfig):
    """sft_consolidate: SFT on the rejection-sampled set (R1 starts this from the base model)."""

    init_from: Literal["base", "cold_start_sft", "grpo_train", "model"] = Field(
        "base", description="base: the pipeline's base model (R1); a stage's model; model: init_model (e.g. a smaller "
        "base to distil into)")
    init_model: str | None = Field(None, min_length=1, description="model folder or hub name trained when init_from: model")
    cold_start_mix: float = Field(0.0, ge=0, le=1, description="share of cold-start rows mixed in (a general "
                                  "source's rows count as general, the rest as reasoning)")
    cold_start_sources: list[str] = Field(default_factory=list, description="mix in only these sources' cold-start "
                                          "rows (e.g. [helpful, unsafe]); empty = every source")
    general_sources: list[DatasetSource] = Field(
        default_factory=list, description="general (non-reasoning) SFT data mixed in as R1 did: {prompt, completion} "
        "columns, or field_map: {messages: COLUMN} for chat sets such as HuggingFaceH4/ultrachat_200k")
    reasoning_to_general: float = Field(3.0, gt=0, description="with general_sources: reasoning rows per general "
                                        "row, every general row counted: general_sources', rejection-sampled answers "
                                        "to general prompts, general cold-start rows (R1: ~600k:200k = 3)")

    @model_validator(mode="after")
    def _check_init(self) -> "ConsolidateConfig":
        if (self.init_from == "model") != (self.init_model is not None):
            raise ValueError("init_from: model needs init_model (a model folder or hub name), and init_model is only "
                             f"read with init_from: model (got init_from {self.init_from!r}, init_model {self.init_model!r})")
        return self



class RewardModelStageConfig(RewardConfig):
    """reward_model (optional; runs only when the config has this section): a reward model trained on
    prepare_data's ``preferences.parquet`` with the Bradley-Terry loss (grpo_core.trainer.reward_model). Later stages
    name it in ``reward_funcs`` as ``{reward_model: {model: reward_model}}``."""

    init_from: Literal["base", "cold_start_sft"] = Field(
        "base", description="the backbone under the fresh score head: the base model (for the embedded default the "
        "tiny model prepare_data builds) or the cold-start SFT model",
    )
    model_name_or_path: str | None = Field(None, min_length=1, description="a different backbone or reward model "
                                           "(local folder / hub name); overrides init_from")
    min_heldout_accuracy: float | None = Field(
        0.9, ge=0, le=1, description="the stage fails, committing nothing, when the held-out pair accuracy of any "
        "source's pairs (or of all pairs) is below this: final RL would optimise a model that misranks them "
        "(the embedded default's: 1.0 in seeds 0-4 at 300 steps; seed 3 held out 0.86 at 120, unsafe pairs 0.70). "
        "Labelled preference sets often hold out lower (0.7-0.8 is common on sets such as UltraFeedback): set it "
        "to what yours should reach; null = no check",
    )


# ------------------------------------------------------------- naming the reward_model stage's model in a section
# The helpers walk a config section's fields (lists and nested models included), so an entry counts wherever it
# sits: GRPOConfig.reward_funcs, a mixture source's reward_funcs, an evaluation's reward-model field.

def is_stage_reference(value: Any) -> bool:
    """``value`` is a reward entry naming the reward_model stage's output (``model: reward_model``)."""
    return isinstance(value, RewardModelSpec) and value.model == REWARD_MODEL_STAGE and value.url is None  # url: a served name


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


def uses_reward_model_stage(section: BaseModel) -> bool:
    """Whether ``section`` holds an entry ``{reward_model: {model: reward_model}}`` anywhere."""
    return any(is_stage_reference(v) for v in walk_fields(section))


def reward_model_upstream(section: BaseModel) -> tuple[str, ...]:
    """``("reward_model",)`` when ``section`` names the stage's model as a reward, else ``()``."""
    return (REWARD_MODEL_STAGE,) if uses_reward_model_stage(section) else ()


def replace_stage_references(value: Any, local: str) -> Any:
    """``value`` with each ``model: reward_model`` entry naming ``local`` instead; only the fields that change are updated, since ``model_copy``
    marks what it updates as set and the trainer's spec carries the set fields (tasks.config.training_spec)."""
    if is_stage_reference(value):
        return value.model_copy(update={"model": local})
    if isinstance(value, BaseModel):
        changed = {name: new for name in type(value).model_fields
                   if (new := replace_stage_references(old := getattr(value, name), local)) is not old}
        return value.model_copy(update=changed) if changed else value
    if isinstance(value, list):
        items = [replace_stage_references(item, local) for item in value]
        return items if any(new is not old for new, old in zip(items, value)) else value
    return value
