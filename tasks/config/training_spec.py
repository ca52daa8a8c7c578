"""What a training stage hands its trainer process: one typed ``TrainingSpec``, never a dict of loose keys.

    tasks.runner.training builds it -> tasks.runner.worker writes it (worker-spec.json; for several nodes also the store,
    where tasks.runner.follower reads it) -> ``python -m tasks.runner.worker SPEC.json`` validates it once and trains

Why typed, and why the set fields only: the trainer config (``SFTConfig``, ``GRPOConfig``, ``RewardConfig``) is
projected from the stage's section once (``trainer_config``: a pipeline section may be a subclass with stage-only
fields such as ``init_from``) and serialised with the fields the user set, nothing more, at every depth (a nested
``sampling:`` section, a source of a mixture, a reward model entry: ``dump_set_fields``), so the child validates it
once from what the user wrote and the defaults stay the trainer's own (a full dump read back marks every field as
set). The run setting that reaches the trainer, ``run.torch_num_threads``, is put into the trainer config here.
"""

from __future__ import annotations

import importlib
from typing import Any, Callable, Literal, NamedTuple, Union, get_args, get_origin

from pydantic import BaseModel, ConfigDict, Field, SerializationInfo, ValidationInfo, field_serializer, field_validator

from grpo_core.config import EvalConfig, GRPOConfig, RewardConfig, SFTConfig, TrackingInfo

TrainerKind = Literal["sft", "grpo", "reward"]  # the stage table's kinds that train (tasks/config/stages.py)
TrainerConfig = Union[SFTConfig, GRPOConfig, RewardConfig]


class Trainer(NamedTuple):
    """A trainer kind: its config class, and its train function by name (``module:function``, imported in the
    training child only, so that reading the table costs no torch import). Every train function is called as
    ``train(config, model_path, rows, output_dir, resume=True, callbacks=[...], tracking=...)``, plus ``eval_rows=``
    when the spec carries held-out rows and ``eval_config=`` when it carries their scoring (GRPO's eval_steps)."""

    config: type[TrainerConfig]
    train: str

    def train_function(self) -> Callable[..., dict[str, Any]]:
        module, _, name = self.train.partition(":")
        return getattr(importlib.import_module(module), name)


# The one registry of trainer kinds: a new kind is one entry here and a stage of that kind in the table.
TRAINERS: dict[str, Trainer] = {
    "sft": Trainer(SFTConfig, "grpo_core.trainer.sft:train_sft"),
    "grpo": Trainer(GRPOConfig, "grpo_core.trainer.loop:train_grpo"),
    "reward": Trainer(RewardConfig, "grpo_core.trainer.reward_model:train_reward_model"),
}


def trainer_config(kind: TrainerKind, section: BaseModel, *, torch_num_threads: int | None) -> TrainerConfig:
    """``section`` as the ``kind`` trainer's config: the trainer fields the user set, plus the run's
    ``torch_num_threads`` (the one home of the setting: tasks.config.pipeline.RunSettings)."""
    cls = TRAINERS[kind].config
    values = {name: getattr(section, name) for name in section.model_fields_set if name in cls.model_fields}
    values.pop("torch_num_threads", None)  # PipelineConfig moves a section's value to run.torch_num_threads
    if torch_num_threads is not None:
        values["torch_num_threads"] = torch_num_threads
    return cls.model_validate(values)


def dump_set_fields(model: BaseModel, mode: str = "python") -> dict[str, Any]:
    """``model`` dumped with only the fields marked as set, at every depth: each nested model (in a field, a list or
    a dict) keeps its own set fields, so read back every model has the values and the set fields it had. A tag field
    (a one-value ``Literal`` such as a reward entry's ``type``) is written, set or not: the union it is in reads it to
    pick the model (pydantic's ``exclude_unset`` drops it from an entry built in code, which then does not read back)."""
    return _set_fields_of(model, model.model_dump(mode=mode))


def _set_fields_of(value: Any, dumped: Any) -> Any:
    """``dumped`` (``value``'s full dump) without the fields ``value``'s models did not mark as set."""
    if isinstance(value, BaseModel) and isinstance(dumped, dict):
        fields = type(value).model_fields
        tags = {name for name, f in fields.items()
                if get_origin(f.annotation) is Literal and len(get_args(f.annotation)) == 1}
        keep = value.model_fields_set | tags
        return {name: _set_fields_of(getattr(value, name), v) for name, v in dumped.items() if name in keep}
    if isinstance(value, (list, tuple)) and isinstance(dumped, (list, tuple)) and len(value) == len(dumped):
        return type(dumped)(_set_fields_of(v, d) for v, d in zip(value, dumped))
    if isinstance(value, dict) and isinstance(dumped, dict):
        return {key: _set_fields_of(value.get(key), d) for key, d in dumped.items()}
    return dumped


class TrainingSpec(BaseModel):
    """One training call: the trainer, its config, local inputs, where checkpoints and progress go."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    kind: TrainerKind
    config: TrainerConfig = Field(description="validated as TRAINERS[kind].config; serialised with its set fields, "
                                  "at every depth (dump_set_fields)")
    model_path: str = Field(description="the starting model: a local folder or a hub name")
    rows_path: str = Field(description="the training rows (parquet)")
    eval_rows_path: str | None = Field(None, description="reward: the held-out pairs, if any; grpo: the held-out "
                                       "prompts of eval_steps")
    eval_config: EvalConfig | None = Field(None, description="grpo with eval_steps: how the held-out slice is scored "
                                           "(the pipeline's evaluate section)")
    tracking: TrackingInfo = Field(default_factory=TrackingInfo, description="run, stage and lineage for the "
                                   "trackers of report_to")
    output_dir: str
    store: str = Field(description="the store URL that receives checkpoints")
    run: str
    stage: str
    key: str = Field(description="the stage fingerprint: a retry resumes only checkpoints written under it")
    keep: int = Field(2, ge=1, description="newest store checkpoints kept (run.keep_checkpoints)")
    resumed_from: int = Field(0, ge=0, description="the step of the store checkpoint fetched before the start")
    events_path: str | None = Field(None, description="subprocess: the progress events file the parent tails")
    result_path: str | None = Field(None, description="subprocess: where global rank 0 writes the result")

    @field_validator("config", mode="before")
    @classmethod
    def _config_of_kind(cls, value: Any, info: ValidationInfo) -> Any:
        kind = info.data.get("kind")
        if kind is None:  # kind itself is invalid: pydantic reports that
            return value
        config_cls = TRAINERS[kind].config
        if isinstance(value, BaseModel):  # a stage section subclass would carry fields the trainer refuses
            if type(value) is not config_cls:
                raise ValueError(f"a {kind} spec takes a {config_cls.__name__}, got a {type(value).__name__}; "
                                 "build it with tasks.config.training_spec.trainer_config")
            return value
        return config_cls.model_validate(value)

    @field_serializer("config")
    def _set_fields(self, config: TrainerConfig, info: SerializationInfo) -> dict[str, Any]:
        return dump_set_fields(config, mode=info.mode)
