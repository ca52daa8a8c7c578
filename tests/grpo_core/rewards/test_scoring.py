"""score_completions (TRL's contract, the one call that scores) and passes (the one "correct")."""

from __future__ import annotations

import math

import pytest
import torch

from grpo_core.generation import Rollout
from grpo_core.rewards.scoring import PASS_TOLERANCE, passes, resolve_reward, score_completions


def _rollouts(texts):
    return [Rollout([1], [i, 2], [0.0, 0.0], False, t) for i, t in enumerate(texts)]


def test_score_completions_follows_the_trl_contract():
    seen = {}

    def reward(completions, prompts, completion_ids, max_completion_length, answer, **kwargs):
        seen.update(completions=completions, prompts=prompts, ids=completion_ids, max_len=max_completion_length,
                    answer=answer, extra=kwargs)
        return [1.0, None, 0.5, None]

    rows = [{"prompt": "q1", "answer": "a1", "task": "t"}, {"prompt": "q2", "answer": "a2", "completion": "sft"}]
    scores = score_completions([reward], ["r"], rows, _rollouts(["c0", "c1", "c2", "c3"]), num_generations=2,
                               max_completion_length=8)
    assert scores.shape == (4, 1)
    assert seen["prompts"] == ["q1", "q1", "q2", "q2"] and seen["answer"] == ["a1", "a1", "a2", "a2"]
    assert seen["completions"] == ["c0", "c1", "c2", "c3"]  # plain prompts: plain completions
    assert seen["ids"][3] == [3, 2] and seen["max_len"] == 8
    assert seen["extra"] == {"task": ["t", "t", None, None]}  # every column of any row; "completion" is not one
    assert scores[:, 0].tolist()[0] == 1.0 and scores[2, 0] == 0.5
    assert math.isnan(scores[1, 0]) and math.isnan(scores[3, 0])  # None -> NaN


def test_chat_prompts_get_chat_completions_and_several_functions_make_columns():
    rows = [{"prompt": [{"role": "user", "content": "1+1="}], "answer": "2"}]
    got = []

    def first(completions, **kwargs):
        got.append(completions)
        return [1.0] * len(completions)

    def second(completions, **kwargs):
        return [0.25] * len(completions)

    scores = score_completions([first, second], ["first", "second"], rows, _rollouts(["x", "y"]), 2, 4)
    assert got[0] == [[{"role": "assistant", "content": "x"}], [{"role": "assistant", "content": "y"}]]
    assert scores.tolist() == [[1.0, 0.25], [1.0, 0.25]]  # [B, R]


def test_a_wrong_number_of_scores_names_the_function():
    rows = [{"prompt": "q", "answer": "a"}]
    with pytest.raises(ValueError, match=r"reward function 'short' returned 1 scores for 2 completions"):
        score_completions([lambda completions, **kw: [1.0]], ["short"], rows, _rollouts(["a", "b"]), 2, 4)
    with pytest.raises(ValueError, match="3 completions for 1 rows x 2 generations"):
        score_completions([lambda completions, **kw: [1.0] * 3], ["f"], rows, _rollouts(["a", "b", "c"]), 2, 4)


def test_passes_is_the_one_definition_of_correct():
    scores = torch.tensor([1.0, 1.0 - PASS_TOLERANCE / 2, 1.0 - 2 * PASS_TOLERANCE, math.nan, 0.0, 2.0])
    assert passes(scores) == [True, True, False, False, False, True]
    assert passes(torch.tensor([0.5, 0.49, math.nan]), 0.5) == [True, False, False]
    assert passes(torch.tensor([0.0, -1.0]), 0.0) == [True, False]


def test_resolve_reward():
    fn, name = resolve_reward("format")
    assert name == "format" and fn.__name__ == "format_reward"

    def mine(completions, **kwargs):
        return [0.0] * len(completions)

    assert resolve_reward(mine) == (mine, "mine")
    with pytest.raises(KeyError, match="unknown reward"):
        resolve_reward("no_such_reward")
