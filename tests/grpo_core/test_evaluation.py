"""Evaluation metrics: hand-computed on scripted rollouts, and end to end on a tiny model that memorised its rows."""

from __future__ import annotations

import math

import pytest
import torch
from transformers import AutoTokenizer

from grpo_core.config import EvalConfig, SFTConfig
from grpo_core.data.synthetic import make_chain_rows, make_cold_start_rows
from grpo_core.evaluation.heldout import evaluate, is_direct
from grpo_core.generation import Rollout
from grpo_core.models.tiny import build_tiny_model
from grpo_core.rewards import REWARD_FUNCS, format_reward
from grpo_core.trainer.sft import train_sft

torch.set_num_threads(1)


class ScriptedBackend:
    """Returns fixed completions: greedy[i] for prompt i, sampled[i][j] for its j-th sample."""

    def __init__(self, tok, greedy, sampled):
        self.tok, self.greedy, self.sampled, self.calls = tok, greedy, sampled, []

    def _rollout(self, prompt, text):
        ids = self.tok(text, add_special_tokens=False)["input_ids"] + [self.tok.eos_token_id]
        return Rollout(prompt, ids, None, False, text)

    def generate(self, prompt_ids, request):
        n, seeds, greedy = request.n, request.seeds, request.greedy
        self.calls.append((len(prompt_ids), n, greedy, list(seeds) if seeds else None))
        out = []
        for p in prompt_ids:
            i = self.prompts.index(p)
            out += [self._rollout(p, self.greedy[i])] if greedy else [self._rollout(p, t) for t in self.sampled[i][:n]]
        return out

    def update_weights(self, model):
        pass


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    return build_tiny_model(tmp_path_factory.mktemp("tiny"), hidden_size=64, num_layers=2, num_heads=2)


def test_metrics_by_hand(tiny):
    tok = AutoTokenizer.from_pretrained(tiny)
    rows = [{"id": f"r{i}", "prompt": [{"role": "user", "content": p}], "answer": a, "task": "chain"}
            for i, (p, a) in enumerate([("1+2+3=", "6"), ("2*3*4=", "24"), ("9-1-1=", "7")])]
    greedy = ["<think>1+2=3;3+3=6</think><answer>6</answer>",  # correct: 4 tags + 11 chars + 1 digit = 16 tokens
              "<think></think><answer>25</answer>",  # direct (not in format: empty think), wrong, 6 tokens
              "7"]  # no format, 1 token
    sampled = [["<think></think><answer>6</answer>", "x"],
               ["<think></think><answer>24</answer>", "<think>2*3=6;6*4=24</think><answer>24</answer>"],
               ["<think></think><answer>7</answer>", "<think></think><answer>8</answer>"]]
    backend = ScriptedBackend(tok, greedy, sampled)
    from grpo_core.generation.prompts import encode_prompt
    backend.prompts = [encode_prompt(tok, r["prompt"]) for r in rows]
    m = evaluate(EvalConfig(num_samples=2, forced_reasoning=False, batch_size=2), tiny, rows, tokenizer=tok,
                 backend=backend, return_rows=True)
    assert m["eval/accuracy"] == pytest.approx(1 / 3)
    assert m["eval/pass@1"] == pytest.approx(4 / 6)
    assert m["eval/format_rate"] == pytest.approx(1 / 3)
    assert [r["format"] for r in m["rows"]] == [True, False, False]
    # the registered format reward's pass rate on the greedy texts, nothing else
    assert m["eval/format_rate"] == pytest.approx(sum(s >= 1.0 for s in format_reward(greedy)) / 3)
    assert m["eval/direct_answer_rate"] == pytest.approx(1 / 3)
    assert m["eval/mean_length"] == pytest.approx((16 + 6 + 1) / 3)
    assert [r["pass@1"] for r in m["rows"]] == [0.5, 1.0, 0.5]
    # prompts chunked by batch_size (greedy) and batch_size // k (sampled); one seed per completion, stable
    assert [c[:3] for c in backend.calls] == [(2, 1, True), (1, 1, True), (1, 2, False), (1, 2, False), (1, 2, False)]
    seeds = [s for c in backend.calls if not c[2] for s in c[3]]
    assert len(set(seeds)) == 6
    again = ScriptedBackend(tok, greedy, sampled)
    again.prompts = backend.prompts
    evaluate(EvalConfig(num_samples=2, forced_reasoning=False, batch_size=64), tiny, rows[::-1], tokenizer=tok,
             backend=again)
    assert sorted(s for c in again.calls if not c[2] for s in c[3]) == sorted(seeds)  # order-independent


def test_direct_answer_helper():
    assert is_direct("<think> </think><answer>3</answer>") and not is_direct("<think>1</think><answer>1</answer>")


def test_format_rate_follows_the_registered_format_reward(tiny, monkeypatch):
    """Swap the registered ``format`` reward: eval/format_rate moves with it (no second format definition)."""
    tok = AutoTokenizer.from_pretrained(tiny)
    rows = [{"id": f"r{i}", "prompt": [{"role": "user", "content": p}], "answer": "6"}
            for i, p in enumerate(["1+2+3=", "2*3*1="])]
    greedy = ["<think>1+2=3;3+3=6</think><answer>6</answer>", "<think>\n2*3=6\n</think>\n<answer>6</answer>\n"]
    from grpo_core.generation.prompts import encode_prompt

    def run():
        backend = ScriptedBackend(tok, greedy, [[], []])
        backend.prompts = [encode_prompt(tok, r["prompt"]) for r in rows]
        return evaluate(EvalConfig(num_samples=0, forced_reasoning=False), tiny, rows, tokenizer=tok, backend=backend)

    assert run()["eval/format_rate"] == 1.0  # the format reward allows whitespace around the tags
    seen = []

    def only_first(completions, **kwargs):
        seen.append(completions)
        return [1.0] + [0.0] * (len(completions) - 1)

    monkeypatch.setitem(REWARD_FUNCS, "format", only_first)
    assert run()["eval/format_rate"] == 0.5
    assert seen[0][1] == [{"role": "assistant", "content": greedy[1]}]  # chat prompt: chat completions, as in training


def test_memorised_model_end_to_end(tiny, tmp_path):
    prompts = make_chain_rows(6, seed=4)
    sft_rows = make_cold_start_rows(prompts, direct_fraction=0.5, seed=1)
    n_direct = sum(is_direct(r["completion"]) for r in sft_rows)
    assert 0 < n_direct < 6
    cfg = SFTConfig(learning_rate=3e-3, max_steps=150, per_device_train_batch_size=6, save_steps=10**6,
                    report_to=[], lr_scheduler_type="constant")
    final = train_sft(cfg, tiny, sft_rows, tmp_path)["final_path"]
    ec = EvalConfig(num_samples=2, temperature=0.01, max_new_tokens=40)
    m = evaluate(ec, final, prompts, return_rows=True)
    assert m["eval/accuracy"] == 1.0
    assert m["eval/format_rate"] == pytest.approx(1 - n_direct / 6)  # direct answers fail the format reward
    assert m["eval/pass@1"] == 1.0  # near-greedy sampling of a memorised model
    assert m["eval/direct_answer_rate"] == pytest.approx(n_direct / 6)
    tok = AutoTokenizer.from_pretrained(final)
    expected_len = sum(len(tok(r["completion"], add_special_tokens=False)["input_ids"]) for r in sft_rows) / 6
    assert m["eval/mean_length"] == pytest.approx(expected_len)
    assert [r["greedy"] for r in m["rows"]] == [r["completion"] for r in sft_rows]
    # forced reasoning: direct rows are re-decoded with a non-empty think block; the others are untouched
    for row, sft in zip(m["rows"], sft_rows):
        assert row["forced"].startswith("<think>") and not is_direct(row["forced"])
        if not is_direct(sft["completion"]):
            assert row["forced"] == row["greedy"]
    assert 0.0 <= m["eval/accuracy_forced_reasoning"] <= 1.0
    m2 = evaluate(EvalConfig(num_samples=0, forced_reasoning=False), final, prompts)
    assert "eval/pass@1" not in m2 and m2["eval/accuracy"] == 1.0


def test_forced_reasoning_needs_single_token_tags(tiny):
    tok = AutoTokenizer.from_pretrained(tiny)

    class NoTags:
        def __getattr__(self, name):
            return getattr(tok, name)

        def __call__(self, text, **kw):
            if text in ("<think>", "</think>"):
                return {"input_ids": [5, 6]}
            return tok(text, **kw)

    rows = make_chain_rows(2, seed=0)
    m = evaluate(EvalConfig(num_samples=0, max_new_tokens=4), tiny, rows, tokenizer=NoTags())
    assert math.isnan(m["eval/accuracy_forced_reasoning"])
    assert m["eval/accuracy"] == 0.0  # an untrained model


def test_emergence_features_of_the_sampled_completions(tiny):
    """eval/reflection_rate and the rest describe the sampled completions (greedy ones without samples)."""
    tok = AutoTokenizer.from_pretrained(tiny)
    rows = [{"id": f"r{i}", "prompt": [{"role": "user", "content": p}], "answer": a, "task": "chain"}
            for i, (p, a) in enumerate([("1+2+3=", "6"), ("2*3*4=", "24")])]
    greedy = ["<think></think><answer>6</answer>", "<think></think><answer>24</answer>"]
    sampled = [["<think>1+2=3;3+3=6. Wait, let me check: 6.</think><answer>6</answer>",  # reflection, correct
                "<think>1+2=4. Actually, that's wrong</think><answer>5</answer>"],  # backtracking, wrong
               ["<think>2*3=6;6*4=24</think><answer>24</answer>",  # plain steps, correct
                "<think></think><answer>20</answer>"]]  # direct, wrong
    from grpo_core.generation.prompts import encode_prompt

    def run(num_samples, **phrases):
        backend = ScriptedBackend(tok, greedy, sampled)
        backend.prompts = [encode_prompt(tok, r["prompt"]) for r in rows]
        config = EvalConfig(num_samples=num_samples, forced_reasoning=False, emergence=phrases)
        return evaluate(config, tiny, rows, tokenizer=tok, backend=backend)

    m = run(2)
    assert m["eval/direct_rate"] == pytest.approx(1 / 4) and m["eval/direct_answer_rate"] == 1.0  # sampled vs greedy
    assert m["eval/mean_steps"] == pytest.approx((3 + 2 + 2 + 0) / 4)
    assert m["eval/reflection_rate"] == pytest.approx(1 / 4)
    assert m["eval/backtrack_rate"] == pytest.approx(1 / 4)
    assert m["eval/accuracy_with_reflection"] == 1.0
    assert m["eval/accuracy_without_reflection"] == pytest.approx(1 / 3)
    custom = run(2, reflection_phrases=["actually"], backtrack_phrases=[])
    assert custom["eval/accuracy_with_reflection"] == 0.0 and custom["eval/backtrack_rate"] == 0.0
    greedy_only = run(0)
    assert greedy_only["eval/direct_rate"] == 1.0 and greedy_only["eval/mean_steps"] == 0.0
    assert math.isnan(greedy_only["eval/accuracy_with_reflection"]) and greedy_only["eval/accuracy_without_reflection"] == 1.0


def test_two_verifiable_sources_each_scored_by_its_own_reward_and_measured_apart(tiny):
    """source_rewards: countdown rows by countdown_accuracy, chain rows by reward_func; every metric also per
    source, from that source's rows only (a chain that never checks does not dilute the countdown's reflection)."""
    tok = AutoTokenizer.from_pretrained(tiny)
    rows = [{"id": "c0", "prompt": [{"role": "user", "content": "1+2+3="}], "answer": "6", "source": "chain"},
            {"id": "c1", "prompt": [{"role": "user", "content": "2*3*4="}], "answer": "24", "source": "chain"},
            {"id": "d0", "prompt": [{"role": "user", "content": "3,8,5->13:"}], "answer": "13", "source": "countdown"}]
    greedy = ["<think>1+2=3;3+3=6</think><answer>6</answer>", "<think>2*3=6;6*4=25</think><answer>25</answer>",
              "<think>3+8=11?13;wait;8+5=13?13</think><answer>8+5</answer>"]
    sampled = [["<think>1+2=3;3+3=6</think><answer>6</answer>", "<think></think><answer>6</answer>"],
               ["<think>2*3=6;6*4=24</think><answer>24</answer>", "<think>2*3=6;6*4=24</think><answer>24</answer>"],
               ["<think>3+8=11?13;wait;8+5=13?13</think><answer>8+5</answer>", "<think>3+8=11</think><answer>3+8</answer>"]]
    from grpo_core.generation.prompts import encode_prompt

    def run(**kw):
        backend = ScriptedBackend(tok, greedy, sampled)
        backend.prompts = [encode_prompt(tok, r["prompt"]) for r in rows]
        return evaluate(EvalConfig(num_samples=2, forced_reasoning=False, **kw), tiny, rows, tokenizer=tok,
                        backend=backend, return_rows=True)

    m = run(source_rewards={"countdown": "countdown_accuracy"})
    assert [r["correct"] for r in m["rows"]] == [True, False, True]
    assert m["eval/accuracy"] == pytest.approx(2 / 3) and m["eval/pass@1"] == pytest.approx(5 / 6)
    assert m["eval/chain/accuracy"] == 0.5 and m["eval/countdown/accuracy"] == 1.0
    assert m["eval/chain/pass@1"] == 1.0 and m["eval/countdown/pass@1"] == 0.5  # a direct right answer passes
    assert m["eval/countdown/reflection_rate"] == 0.5 and m["eval/chain/reflection_rate"] == 0.0
    assert m["eval/reflection_rate"] == pytest.approx(1 / 6)
    assert m["eval/countdown/accuracy_with_reflection"] == 1.0
    assert m["eval/countdown/accuracy_without_reflection"] == 0.0
    assert m["eval/countdown/num_rows"] == 1 and m["eval/chain/num_rows"] == 2
    assert m["eval/chain/direct_rate"] == 0.25 and m["eval/countdown/direct_rate"] == 0.0
    # checking measured as checking, over the sampled countdown completions: one checks a miss and retries (and
    # stops on its hit), the other commits to its miss unchecked; the chain has no tries, the mix no own numbers
    assert m["eval/countdown/checking_rate"] == 0.5 and m["eval/countdown/miss_retry_rate"] == 0.5
    assert m["eval/countdown/hit_stop_rate"] == 1.0 and m["eval/countdown/first_try_hit_rate"] == 0.0
    assert m["eval/countdown/retry_hit_rate"] == 1.0 and m["eval/countdown/reflection_after_hit_rate"] == 0.0
    assert "eval/chain/checking_rate" not in m and "eval/checking_rate" not in m
    # without the countdown's reward, chain_accuracy cannot score it: never correct
    assert run()["eval/countdown/accuracy"] == 0.0


def test_one_source_with_tries_gets_the_checking_numbers_unprefixed(tiny):
    """A countdown-only evaluation: the checking numbers are the evaluation's own keys (issue 42)."""
    tok = AutoTokenizer.from_pretrained(tiny)
    rows = [{"id": "d0", "prompt": "3,8,5->13:", "answer": "13", "source": "countdown"}]
    sampled = [["<think>3+8=11?13;wait;8+5=13?13</think><answer>8+5</answer>",
                "<think>wait</think><answer>8+5</answer>"]]  # a word with no try is not a check
    from grpo_core.generation.prompts import encode_prompt

    backend = ScriptedBackend(tok, ["<think>8+5=13</think><answer>8+5</answer>"], sampled)
    backend.prompts = [encode_prompt(tok, r["prompt"]) for r in rows]
    m = evaluate(EvalConfig(num_samples=2, forced_reasoning=False, reward_func="countdown_accuracy"), tiny, rows,
                 tokenizer=tok, backend=backend)
    assert m["eval/reflection_rate"] == 1.0 and m["eval/checking_rate"] == 0.5
    assert m["eval/reflection_without_try_rate"] == 0.5 and m["eval/miss_retry_rate"] == 1.0
    assert "eval/countdown/checking_rate" not in m
