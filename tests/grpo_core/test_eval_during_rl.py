"""GRPO's eval_steps: held-out ``eval/...`` rows at every eval_steps-th step (logged even off logging_steps), and
evaluation leaves training exactly as it was (same weights, same RNG, the step's reward counters kept)."""

from __future__ import annotations

import random

import numpy as np
import pytest
import torch

from grpo_core.config import EvalConfig, GRPOConfig
from grpo_core.generation import Rollout
from grpo_core.rewards import pop_reward_stats
from grpo_core.rewards.base import count_reward_event
from grpo_core.trainer.during_rl import evaluate_during_rl, rl_eval_config
from tests.grpo_core.run_helpers import assert_same_final_weights, read_metrics

ROWS = [{"prompt": [{"role": "user", "content": f"{i}+{i}="}], "answer": str(2 * i), "source": "sq"} for i in range(12)]
HELD_OUT = [{"prompt": [{"role": "user", "content": f"{i}+1="}], "answer": str(i + 1), "source": "sq"} for i in range(6)]


def config(**overrides) -> GRPOConfig:
    return GRPOConfig(use_vllm=False, max_steps=6, generation_batch_size=8, num_generations=4, max_completion_length=6,
                      max_prompt_length=16, per_device_train_batch_size=8, learning_rate=5e-3, beta=0.04, seed=3,
                      save_steps=3, logging_steps=5, report_to=["jsonl"], reward_funcs=["math_accuracy"],
                      torch_num_threads=1, **overrides)


def test_eval_steps_logs_heldout_metrics_at_its_steps_and_changes_no_weight(tmp_path):
    from grpo_core.models.tiny import build_tiny_model
    from grpo_core.trainer.loop import train_grpo

    torch.set_num_threads(1)
    model = build_tiny_model(tmp_path / "tiny", hidden_size=32, num_layers=2, num_heads=2)
    train_grpo(config(), model, ROWS, tmp_path / "plain", resume=False)
    train_grpo(config(eval_steps=2, eval_samples=4), model, ROWS, tmp_path / "evaluated", resume=False,
               eval_rows=HELD_OUT)

    rows = read_metrics(tmp_path / "evaluated")
    assert [r["step"] for r in rows] == [2, 4, 5, 6]  # logging_steps 5 (and the last), eval_steps 2 (logged too)
    assert [r["step"] for r in rows if "eval/accuracy" in r] == [2, 4, 6]
    for row in (r for r in rows if r["step"] != 5):
        assert row["eval/num_rows"] == 4 and 0.0 <= row["eval/pass@1"] <= 1.0 and row["time/eval"] > 0
        assert {"eval/reflection_rate", "eval/mean_steps", "eval/direct_rate", "eval/mean_length"} <= set(row)
    plain = {r["step"]: r for r in read_metrics(tmp_path / "plain")}
    assert sorted(plain) == [5, 6]
    for row in (r for r in rows if r["step"] in plain):  # the training numbers of the shared steps, to the bit
        assert {k: row[k] for k in ("loss", "reward", "grad_norm")} == {k: plain[row["step"]][k] for k in
                                                                      ("loss", "reward", "grad_norm")}
    assert_same_final_weights(tmp_path / "plain", tmp_path / "evaluated")


class RandomBackend:
    """A sampler that draws from every global RNG, as a careless backend would."""

    def generate(self, prompt_ids, request):
        n = request.n
        random.random(), np.random.rand(), torch.rand(1)
        return [Rollout(list(p), [5], None, False, "<answer>2</answer>") for p in prompt_ids for _ in range(n)]


class Tokenizer:
    def apply_chat_template(self, messages, **kwargs):
        return [1, 2, 3]

    def __call__(self, text, **kwargs):
        return {"input_ids": [1, 2, 3]}


def test_evaluation_during_rl_moves_no_rng_and_keeps_the_steps_reward_counters():
    pop_reward_stats()
    count_reward_event("math_accuracy", "timeouts", 2)  # the training step's, not yet logged
    states = (random.getstate(), np.random.get_state()[1].copy(), torch.get_rng_state())
    cfg = rl_eval_config(config(eval_steps=2), EvalConfig(reward_func="math_accuracy"))
    metrics = evaluate_during_rl(cfg, RandomBackend(), Tokenizer(), HELD_OUT[:2])
    assert metrics["eval/num_rows"] == 2 and "eval/pass@1" in metrics and "eval/accuracy_forced_reasoning" not in metrics
    assert random.getstate() == states[0] and (np.random.get_state()[1] == states[1]).all()
    assert torch.equal(torch.get_rng_state(), states[2])
    assert pop_reward_stats() == {"rewards/math_accuracy/timeouts": 2.0}


def test_eval_steps_without_heldout_rows_or_with_async_rollouts_is_refused(tmp_path):
    from grpo_core.trainer.loop import train_grpo

    with pytest.raises(ValueError, match="eval_steps is set but no held-out rows were given: pass eval_rows"):
        train_grpo(config(eval_steps=2), "unused-model", ROWS, tmp_path)
    with pytest.raises(ValueError, match="set async_rollouts: false or remove eval_steps"):
        config(eval_steps=2, async_rollouts=True)
