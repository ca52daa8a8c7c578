"""Rejection sampling for every source: a verifiable source keeps correct samples, a non-verifiable one keeps the
best-scored samples of a (tiny, trained) reward model above min_score; per-source counts; config checks."""

from __future__ import annotations

import pytest
import torch
from transformers import AutoTokenizer

from grpo_core.config import RejectionSamplingConfig, RewardConfig, RewardModelSpec
from grpo_core.generation.prompts import encode_prompt
from grpo_core.models.tiny import build_tiny_model
from grpo_core.recipe.rejection import rejection_sample
from grpo_core.rewards.reward_model import RewardModelReward
from grpo_core.trainer.reward_model import train_reward_model
from tests.grpo_core.test_rejection import ScriptedBackend
from tests.grpo_core.test_reward_model import BAD, GOOD, pairs

torch.set_num_threads(1)


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    """The policy's tokenizer (a tiny model) and a reward model trained to prefer GOOD-like answers over 'No.'."""
    root = tmp_path_factory.mktemp("rs")
    base = build_tiny_model(root / "base", hidden_size=64, num_layers=2)
    config = RewardConfig(max_steps=24, per_device_train_batch_size=8, learning_rate=1e-3, report_to=["jsonl"],
                          save_steps=100, max_length=128)
    return base, train_reward_model(config, base, pairs(160, 0), root / "rm", resume=False)["final_path"]


CORRECT, WRONG = "<think>1+2=3;3+3=6</think><answer>6</answer>", "<think>1+2=4</think><answer>7</answer>"


def test_each_source_is_kept_by_its_own_rule(models):
    base, rm = models
    tok = AutoTokenizer.from_pretrained(base)
    chain = {"id": "c", "prompt": [{"role": "user", "content": "1+2+3="}], "answer": "6", "source": "chain"}
    helpful = {"id": "h", "prompt": [{"role": "user", "content": "How do I fix a lamp?"}], "answer": "",
               "source": "helpful"}
    other = {"id": "o", "prompt": [{"role": "user", "content": "2+2="}], "answer": "4", "source": "unlisted"}
    answers = [f"<think>ok</think>{t}" for t in (GOOD, GOOD.replace("Sure", "Of course"), BAD, BAD.lower())]
    spec = RewardModelSpec(model=rm, scope="summary")
    scores = RewardModelReward(spec)(prompts=[helpful["prompt"]] * 4, completions=answers)
    assert min(scores[:2]) > 0.5 * (max(scores[:2]) + max(scores[2:])) > max(scores[2:]), scores
    min_score = 0.5 * (min(scores[:2]) + max(scores[2:]))  # between the helpful answers and the bare 'No.'
    low, high = sorted(range(2), key=lambda j: scores[j])
    # sample order: a 'No.', the lower-scored good answer, the other 'No.', the best one last
    helpful_samples = [answers[2], answers[low], answers[3], answers[high]]
    chain_samples = [WRONG, CORRECT, CORRECT, WRONG]  # the verifiable rule: correct ones, deduplicated
    rows = [chain, helpful, other]
    prompts = [encode_prompt(tok, r["prompt"]) for r in rows]
    backend = ScriptedBackend(tok, prompts, [[(t, False) for t in s] for s in (chain_samples, helpful_samples, [])])
    config = RejectionSamplingConfig(num_samples=4, keep_per_prompt=2, sources=[
        {"name": "chain", "reward_func": "chain_accuracy"},
        {"name": "helpful", "reward_func": {"reward_model": {"model": rm, "scope": "summary"}}, "min_score": min_score,
         "keep_per_prompt": 1, "require_format": False},
    ])
    kept, stats = rejection_sample(config, backend, tok, rows)
    assert [(k["source"], k["completion"]) for k in kept] == [("chain", CORRECT), ("helpful", answers[high])]
    assert stats["rs/chain/num_kept"] == 1 and stats["rs/chain/rejected/incorrect"] == 2
    assert stats["rs/chain/rejected/duplicate"] == 1
    # helpful: both 'No.' below min_score; of the two above it the best is kept, the other is over k=1
    assert stats["rs/helpful/num_kept"] == 1 and stats["rs/helpful/rejected/incorrect"] == 2
    assert stats["rs/helpful/rejected/over_limit"] == 1 and stats["rs/helpful/mean_pass_rate"] == 0.5
    assert stats["rs/num_kept"] == 2 and stats["rs/num_samples"] == 8 and stats["rs/prompts_unlisted"] == 1
    assert stats["rs/rejected/incorrect"] == 4 and stats["rs/mean_pass_rate"] == 0.5
    assert [(p["source"], p["kept"]) for p in stats["per_prompt"]] == [("chain", 1), ("helpful", 1)]

    # min_score above every score: nothing is kept (the rule is the score, not the verifiable pass mark)
    above = config.model_copy(update={"sources": [config.sources[1].model_copy(update={"min_score": max(scores) + 1})]})
    backend = ScriptedBackend(tok, prompts, [[(t, False) for t in s] for s in ([], helpful_samples, [])])
    kept, stats = rejection_sample(above, backend, tok, rows)
    assert kept == [] and stats["rs/helpful/rejected/incorrect"] == 4

    # the same helpful samples under the section's format rule: no \boxed / <answer>, so none is kept
    strict = config.model_copy(update={"sources": [config.sources[1].model_copy(update={"require_format": None})]})
    backend = ScriptedBackend(tok, prompts, [[(t, False) for t in s] for s in ([], helpful_samples, [])])
    kept, stats = rejection_sample(strict, backend, tok, rows)
    assert kept == [] and stats["rs/helpful/rejected/format"] == 2


def test_single_source_fields_still_work(models):
    base, _ = models
    tok = AutoTokenizer.from_pretrained(base)
    rows = [{"id": "c", "prompt": [{"role": "user", "content": "1+2+3="}], "answer": "6"}]
    backend = ScriptedBackend(tok, [encode_prompt(tok, rows[0]["prompt"])], [[(WRONG, False), (CORRECT, False)]])
    kept, stats = rejection_sample(RejectionSamplingConfig(num_samples=2), backend, tok, rows)
    assert [k["completion"] for k in kept] == [CORRECT] and stats["rs/num_kept"] == 1
    assert not any(k.count("/") > 1 and not k.startswith("rs/rejected") for k in stats)  # no per-source keys


def test_a_rule_for_a_source_with_no_rows_names_the_sources_present(models):
    base, _ = models
    tok = AutoTokenizer.from_pretrained(base)
    rows = [{"id": "c", "prompt": [{"role": "user", "content": "1+2+3="}], "answer": "6", "source": "chain"}]
    config = RejectionSamplingConfig(sources=[{"name": "chian", "reward_func": "chain_accuracy"}])
    with pytest.raises(ValueError, match=r"names 'chian' but no training row has that source \(sources present: \['chain'\]\)"):
        rejection_sample(config, ScriptedBackend(tok, [], []), tok, rows)


@pytest.mark.parametrize("sources, message", [
    ([{"name": "helpful", "reward_func": {"reward_model": {"model": "m"}}}], "give min_score"),
    ([{"name": "c", "reward_func": "chain_accuracy"}] * 2, "names a source twice"),
    ([{"name": "c", "reward_func": "chain_accuracy", "min_score": 0.0, "reward_threshold": 1.0}], "not both"),
])
def test_bad_rules_fail_early(sources, message):
    with pytest.raises(ValueError, match=message):
        RejectionSamplingConfig(sources=sources)
    with pytest.raises(ValueError, match="each source names its own reward_func"):
        RejectionSamplingConfig(reward_func="math_accuracy", sources=[{"name": "c", "reward_func": "chain_accuracy"}])


def test_max_prompts_is_per_source(models):
    """The first N prompts of each source: a source listed after N rows of another is still sampled."""
    base, _ = models
    tok = AutoTokenizer.from_pretrained(base)
    rows = [{"id": f"{s}{i}", "prompt": [{"role": "user", "content": f"{i}+1+5="}], "answer": "6", "source": s}
            for s, i in (("a", 0), ("a", 1), ("b", 2))]
    prompts = [encode_prompt(tok, r["prompt"]) for r in rows]
    backend = ScriptedBackend(tok, prompts, [[(CORRECT, False)]] * 3)
    config = RejectionSamplingConfig(num_samples=1, max_prompts=1, sources=[
        {"name": "a", "reward_func": "chain_accuracy"}, {"name": "b", "reward_func": "chain_accuracy"}])
    kept, stats = rejection_sample(config, backend, tok, rows)
    assert stats["rs/a/num_prompts"] == 1 and stats["rs/b/num_prompts"] == 1 and stats["rs/num_prompts"] == 2
    assert [k["id"] for k in kept] == ["a0-rs0", "b2-rs0"]
