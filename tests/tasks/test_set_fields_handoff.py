"""The hand-off writes the fields the user set at every depth (issue 41): a nested ``sampling:`` section, a mixture's
sources and their reward entries arrive in the training child with the fields the user set marked as set, and only
those, as the section had them; the values are the section's, defaults included."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from pydantic import BaseModel

from grpo_core.config import GRPOConfig, RewardModelSpec, SFTConfig, SourceMix, SourceWeight
from tasks.config.pipeline import PipelineConfig, load_config
from tasks.config.training_spec import TrainingSpec, dump_set_fields, trainer_config

ROOT = Path(__file__).resolve().parents[2]


def fields_set(value: Any) -> Any:
    """Every model's fields marked as set, recursively."""
    if isinstance(value, BaseModel):
        return (value.model_fields_set, {k: fields_set(getattr(value, k)) for k in type(value).model_fields})
    if isinstance(value, (list, tuple)):
        return [fields_set(v) for v in value]
    return None


def through_the_child(kind: str, config) -> tuple[dict, Any]:
    """(the spec's config as written to worker-spec.json, the trainer config the child validates from it)."""
    wire = TrainingSpec(kind=kind, config=config, model_path="m", rows_path="rows.parquet", output_dir="out",
                        store="store", run="r", stage="s", key="k").model_dump_json()
    return json.loads(wire)["config"], TrainingSpec.model_validate_json(wire).config


def test_a_nested_sampling_section_keeps_only_the_users_fields_set_in_the_child():
    config = PipelineConfig.model_validate({"model": {"tiny": {}}, "grpo_train": {
        "learning_rate": 1e-5, "sampling": {"num_generations": 4, "temperature": 0.7},
        "sources": [{"name": "chain", "reward_funcs": ["chain_accuracy"]}]}})
    trainer = trainer_config("grpo", config.grpo_train, torch_num_threads=None)
    wire, child = through_the_child("grpo", trainer)
    assert wire == {"learning_rate": 1e-5, "sampling": {"num_generations": 4, "temperature": 0.7},
                    "sources": [{"name": "chain", "reward_funcs": ["chain_accuracy"]}]}
    assert child.sampling.model_fields_set == {"num_generations", "temperature"}  # was all 18 of GRPOSampling's
    assert child.sources[0].model_fields_set == {"name", "reward_funcs"}
    assert child == trainer and child.model_dump() == config.grpo_train.model_dump(include=set(GRPOConfig.model_fields))
    assert child.sampling.max_completion_length == 1024 and child.sampling.vllm_gpu_memory_utilization == 0.3


def test_entries_built_in_code_read_back_with_their_tag():
    """A reward model entry built in code has ``type`` unset; the union reads it to pick the model, so it is written."""
    trainer = GRPOConfig(sources=[SourceMix(name="helpful", reward_funcs=[
        RewardModelSpec(model="/rm", reward_clip_range=(-3, 3))])], generation_batch_size=16)
    wire, child = through_the_child("grpo", trainer)
    assert wire["sources"] == [{"name": "helpful", "reward_funcs": [
        {"type": "reward_model", "model": "/rm", "reward_clip_range": [-3.0, 3.0]}]}]
    assert child == trainer and child.sources[0].reward_funcs[0].model_fields_set == {"type", "model",
                                                                                       "reward_clip_range"}
    sft = SFTConfig(sources=[SourceWeight(name="chain")], max_steps=3)
    wire, child = through_the_child("sft", sft)
    assert wire == {"sources": [{"name": "chain"}], "max_steps": 3} and child == sft
    assert fields_set(child) == fields_set(sft)


@pytest.mark.parametrize("path", sorted((ROOT / "configs").glob("*.yaml")), ids=lambda p: p.name)
def test_every_shipped_trainer_config_reads_back_the_same_with_the_same_fields_set(path):
    config = load_config(path)
    for name, kind in (("cold_start_sft", "sft"), ("reward_model", "reward"), ("grpo_train", "grpo"),
                       ("sft_consolidate", "sft"), ("final_rl", "grpo")):
        if getattr(config, name) is None:
            continue
        trainer = trainer_config(kind, getattr(config, name), torch_num_threads=config.run.torch_num_threads)
        _, child = through_the_child(kind, trainer)
        assert child == trainer and child.model_dump() == trainer.model_dump(), name
        assert fields_set(child) == fields_set(trainer), name
    assert dump_set_fields(config.grpo_train)["sampling"] == config.grpo_train.sampling.model_dump(exclude_unset=True)
