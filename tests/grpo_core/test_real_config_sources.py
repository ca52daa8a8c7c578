"""The real configs' R1 data: their cold-start trace set and consolidation's general source load from small local
files in those data sets' schemas, and the cold-start SFT is a real one (hundreds of steps, not one).

Each config's own entry (field_map, filters, split) is used with its hub name swapped for a local file: the
trace set's rows as open-r1/OpenR1-Math-220k has them (tests/grpo_core/trace_fixtures.py), the general rows as
HuggingFaceH4/ultrachat_200k has them (prompt, prompt_id, messages)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from grpo_core.recipe.cold_start import load_trace_rows
from grpo_core.recipe.consolidation import load_general_rows, mix_by_ratio
from tasks.config.pipeline import load_config
from tasks.config.plan import config_hardware
from tests.grpo_core.trace_fixtures import write_openr1

ROOT = Path(__file__).resolve().parents[2]
CONFIGS = ["qwen2.5-0.5b-gsm8k.yaml", "qwen2.5-7b-math.yaml"]

ULTRACHAT = [  # train_sft columns
    {"prompt": "Write a haiku about autumn.", "prompt_id": "u1",
     "messages": [{"role": "user", "content": "Write a haiku about autumn."},
                  {"role": "assistant", "content": "Red leaves drift and fall / ..."}]},
    {"prompt": "What is the capital of Peru?", "prompt_id": "u2",
     "messages": [{"role": "user", "content": "What is the capital of Peru?"},
                  {"role": "assistant", "content": "Lima."},
                  {"role": "user", "content": "And its population?"},
                  {"role": "assistant", "content": "About ten million in the metro area."}]},
]


@pytest.mark.parametrize("config_name", CONFIGS)
def test_cold_start_trace_set_of_the_real_config_loads_filters_and_is_a_real_sft(tmp_path, config_name):
    path = ROOT / "configs" / config_name
    cfg = load_config(path)
    (src,) = cfg.data.cold_start_sources
    assert src.kind == "traces" and src.dataset == "open-r1/OpenR1-Math-220k"
    local = src.model_copy(update={"dataset": str(write_openr1(tmp_path / "openr1.parquet", num_problems=8))})
    rows, stats = load_trace_rows(local)
    # fixture patterns per 4 problems: 1 clean, 1 clean (code one dropped), none readable, 1 (a repeat dropped)
    assert stats["kept"] == len(rows) == 6 and stats["problems"] == 8
    assert stats["rejected/code_block"] == 2 and stats["unverified"] == 4 and stats["duplicate"] == 2
    assert all(r["completion"].startswith("<think>\n") and "\\boxed" in r["completion"] for r in rows)
    assert rows[0]["prompt"][-1]["content"].startswith("What is 10 + 20?\n")
    assert rows[0]["prompt"][-1]["content"].endswith("\\boxed{}.")  # the set's answers are boxed; so is the ask

    # steps = traces x epochs / (batch x GPUs x grad-accum) with traces <= limit x k: hundreds of optimizer steps,
    # and between half an epoch and four epochs of the configured traces (about half pass the overlong cap)
    sft, gpus = cfg.cold_start_sft, config_hardware(path).gpus
    assert "max_steps" in sft.model_fields_set and sft.max_steps >= 100
    traces = src.limit * src.keep_per_prompt
    epochs = sft.max_steps * sft.per_device_train_batch_size * gpus * sft.gradient_accumulation_steps / traces
    assert 0.5 <= epochs <= 4, f"{sft.max_steps} steps are {epochs:.2f} epochs of {traces} traces"


@pytest.mark.parametrize("config_name", CONFIGS)
def test_general_sft_source_of_the_real_config_loads_and_mixes_at_three_to_one(tmp_path, config_name):
    section = load_config(ROOT / "configs" / config_name).sft_consolidate
    (src,) = section.general_sources
    assert src.path == "HuggingFaceH4/ultrachat_200k" and section.reasoning_to_general == 3
    local = tmp_path / "ultrachat.jsonl"
    local.write_text("".join(json.dumps(r) + "\n" for r in ULTRACHAT))
    general = load_general_rows(src.model_copy(update={"path": str(local)}))
    assert [r["completion"] for r in general] == ["Red leaves drift and fall / ...", "About ten million in the metro area."]
    assert general[1]["prompt"] == ULTRACHAT[1]["messages"][:3]
    reasoning = [{"prompt": [{"role": "user", "content": f"q{i}"}], "completion": "<think>\nr\n</think>\n\na"}
                 for i in range(6)]
    _, counts = mix_by_ratio(reasoning, {src.path: general}, section.reasoning_to_general)
    assert counts == {"reasoning": 6, f"general:{src.path}": 2}


@pytest.mark.parametrize("config_name", CONFIGS)
def test_rejection_sampling_has_a_rule_for_every_training_source(config_name):
    cfg = load_config(ROOT / "configs" / config_name)
    rules = {s.name: s for s in cfg.rejection_sample.sources}
    assert set(rules) == {s.source for s in cfg.data.train_sources}
    reasoning = cfg.grpo_train.sources[0].name
    assert rules[reasoning].reward_func == "math_accuracy" and rules[reasoning].min_score is None
    assert all(r.min_score is not None and r.reward_func.type == "reward_model" for n, r in rules.items() if n != reasoning)
    # sft_consolidate counts a source's answers as general when its prompts have no reference answer
    # (grpo_core.recipe.consolidation.general_source_names): the scored sources are exactly those
    assert {s.source for s in cfg.data.train_sources if s.answer_format == "none"} == set(rules) - {reasoning}
