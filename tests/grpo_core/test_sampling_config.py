"""One SamplingConfig nested wherever generation happens (issue 27): each use keeps its own defaults, a section
setting one field keeps its use's defaults for the others, flat fields still read (a flat key that disagrees with
its nested one is an error naming both), the older names with a warning naming the new spelling (issue 41), and a
dumped config reads back the same."""

from __future__ import annotations

import warnings

import pytest
import torch
from pydantic import ValidationError

from grpo_core.config import (SAMPLING_RENAMES, EvalConfig, GRPOConfig, GRPOSampling, RejectionSamplingConfig,
                              SamplingConfig, TeacherSource)
from grpo_core.generation import backend_options

USES = {  # section -> the defaults its sampling had as flat fields before the nesting
    "grpo": (lambda **kw: GRPOConfig(**kw), dict(num_generations=8, temperature=1.0, top_p=1.0,
             max_prompt_length=512, max_completion_length=1024, long_prompts="truncate", use_vllm=None,
             vllm_gpu_memory_utilization=0.3)),
    "evaluate": (lambda **kw: EvalConfig(**kw), dict(num_generations=4, temperature=0.6, top_p=0.95,
                 max_prompt_length=512, max_completion_length=64, long_prompts="truncate", use_vllm=None,
                 vllm_gpu_memory_utilization=0.9, batch_size=64)),
    "rejection_sample": (lambda **kw: RejectionSamplingConfig(**kw), dict(num_generations=4, temperature=1.0,
                         top_p=1.0, max_prompt_length=512, max_completion_length=64, long_prompts="truncate",
                         batch_size=64)),
    "teacher": (lambda **kw: TeacherSource(model="m", **kw), dict(num_generations=4, temperature=0.7, top_p=0.95,
                max_prompt_length=2048, max_completion_length=1024, long_prompts="drop", use_vllm=False,
                vllm_gpu_memory_utilization=0.9, batch_size=16)),
}


@pytest.mark.parametrize("use", USES)
def test_each_use_keeps_its_defaults_when_one_field_is_set(use):
    make, defaults = USES[use]
    for sampling in (make().sampling, make(sampling={"top_k": 5}).sampling, make(top_k=5).sampling):
        assert {k: getattr(sampling, k) for k in defaults} == defaults
    assert make(sampling={"top_k": 5}).sampling.top_k == 5 and make(top_k=5).sampling.top_k == 5


def test_older_flat_names_read_into_the_nested_section():
    with pytest.warns(FutureWarning, match="num_samples is now sampling.num_generations"):
        old = EvalConfig(num_samples=2, max_new_tokens=16, temperature=1.0, batch_size=8, use_vllm=False)
    new = EvalConfig(sampling={"num_generations": 2, "max_completion_length": 16, "temperature": 1.0,
                               "batch_size": 8, "use_vllm": False})
    assert old == new
    with pytest.warns(FutureWarning):
        assert RejectionSamplingConfig(num_samples=3).sampling.num_generations == 3
        assert TeacherSource(model="m", max_new_tokens=7).sampling.max_completion_length == 7
    grpo = GRPOConfig(num_generations=4, generation_batch_size=8, vllm_enable_sleep_mode=True, use_vllm=True)
    assert grpo.sampling.num_generations == 4 and grpo.sampling.vllm_enable_sleep_mode
    assert grpo.generation_batch_size == 8  # a training field: stays on the section (TRL's GRPOConfig)


SECTIONS = {"grpo": lambda **kw: GRPOConfig(generation_batch_size=16, **kw), "evaluate": EvalConfig,
            "rejection_sample": RejectionSamplingConfig, "teacher": lambda **kw: TeacherSource(model="m", **kw)}


@pytest.mark.parametrize("use", SECTIONS)
@pytest.mark.parametrize("old", SAMPLING_RENAMES)
def test_each_older_name_warns_with_its_new_spelling_and_gives_the_same_config(use, old):
    new, make = SAMPLING_RENAMES[old], SECTIONS[use]
    with pytest.warns(FutureWarning, match=rf"^{old} is now sampling\.{new}: the older name is read until the next "
                                           r"release; write the new one$"):
        older = make(**{old: 8})
    with warnings.catch_warnings():
        warnings.simplefilter("error", FutureWarning)  # the new spelling, flat (TRL's layout) or nested: no warning
        flat, nested = make(**{new: 8}), make(sampling={new: 8})
    assert older == flat == nested and getattr(older.sampling, new) == 8
    assert older.model_fields_set == nested.model_fields_set  # what the hand-off passes on is the same too
    assert older.sampling.model_fields_set == nested.sampling.model_fields_set == {new}


def test_both_older_names_warn_at_once_naming_where_they_are():
    with pytest.warns(FutureWarning) as caught:
        SamplingConfig.nest_flat_fields({"num_samples": 2, "max_new_tokens": 9, "temperature": 0.5}, where="evaluate")
    assert [str(w.message) for w in caught] == [
        "evaluate.num_samples is now evaluate.sampling.num_generations, evaluate.max_new_tokens is now "
        "evaluate.sampling.max_completion_length: the older names are read until the next release; write the new ones"]


def test_a_flat_key_that_disagrees_with_its_nested_one_names_both():
    with pytest.raises(ValidationError, match=r"num_samples: 2 and sampling.num_generations: 3 are both set"):
        EvalConfig(num_samples=2, sampling={"num_generations": 3})
    with pytest.raises(ValidationError, match=r"temperature: 0.5 and sampling.temperature: 0.9 are both set"):
        GRPOConfig(temperature=0.5, sampling={"temperature": 0.9})
    assert EvalConfig(temperature=0.5, sampling={"temperature": 0.5}).sampling.temperature == 0.5  # the same: fine


def test_a_dumped_config_reads_back_the_same():
    for config in (GRPOConfig(temperature=0.8, num_generations=4, generation_batch_size=8),
                   EvalConfig(num_generations=2, use_vllm=True), RejectionSamplingConfig(use_vllm=False, top_p=0.9),
                   TeacherSource(model="m", sampling={"num_generations": 2})):
        assert type(config).model_validate(config.model_dump()) == config
        assert type(config).model_validate(config.model_dump(exclude_unset=True)) == config


def test_backend_options_read_the_sampling_section():
    sampling = SamplingConfig(max_prompt_length=32, max_completion_length=8, vllm_gpu_memory_utilization=0.5,
                              vllm_tensor_parallel_size=2, vllm_kv_cache_memory_bytes=2**20)
    opts = backend_options(sampling, "vllm", torch.device("cpu"), seed=3)
    assert opts == {"max_model_len": 40, "gpu_memory_utilization": 0.5, "tensor_parallel_size": 2,
                    "kv_cache_memory_bytes": 2**20, "seed": 3, "enable_sleep_mode": False}
    assert backend_options(GRPOSampling(vllm_enable_sleep_mode=True), "vllm", torch.device("cpu"),
                           seed=0)["enable_sleep_mode"] is True
    assert backend_options(sampling, "hf", torch.device("cpu"), seed=0, bf16=True) == {"autocast_dtype": None}
