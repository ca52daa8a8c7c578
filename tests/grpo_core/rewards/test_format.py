"""format reward: the <think>...</think> + answer template, decided per the rules in grpo_core/rewards/format.py.

Run: python -m pytest tests/grpo_core/rewards/test_format.py -q
"""

from __future__ import annotations

import time

import pytest

from grpo_core.rewards import REWARD_FUNCS, format_reward

GOOD = [
    "<think>2+3=5</think><answer>5</answer>",
    "  \n<think>\nadd them\n</think>\n<answer>\n\\frac{1}{2}\n</answer>\n",
    "<think>so</think>\nThe final answer is $\\boxed{5}$.",
    "<think>so</think>\n\\[\\boxed{\\frac{1}{2}}\\]",
    "<think>so</think> \\boxed{\\{1,2\\}}",
]
BAD = {
    "no think": "<answer>5</answer>",
    "think not first": "Sure! <think>x</think><answer>5</answer>",
    "empty think": "<think>  </think><answer>5</answer>",
    "two thinks": "<think>a</think><think>b</think><answer>5</answer>",
    "unclosed think": "<think>a <answer>5</answer>",
    "no answer": "<think>a</think> the answer is 5",
    "empty answer": "<think>a</think><answer> </answer>",
    "text after answer": "<think>a</think><answer>5</answer> and more words",
    "text before answer": "<think>a</think> so <answer>5</answer>",
    "two answers": "<think>a</think><answer>5</answer><answer>6</answer>",
    "prose after box": "<think>a</think> \\boxed{5} but maybe it is 6",
    "empty box": "<think>a</think> \\boxed{ }",
    "unclosed box": "<think>a</think> \\boxed{5",
    "answer inside think only": "<think><answer>5</answer></think>",
}


@pytest.mark.parametrize("completion", GOOD)
def test_good_format_scores_one(completion: str):
    assert format_reward([completion]) == [1.0]


@pytest.mark.parametrize("name", list(BAD))
def test_bad_format_scores_zero(name: str):
    assert format_reward([BAD[name]]) == [0.0], name


def test_registered_and_accepts_trainer_kwargs():
    assert REWARD_FUNCS["format"] is format_reward
    chat = [[{"role": "assistant", "content": GOOD[0]}], [{"role": "assistant", "content": BAD["no think"]}]]
    scores = format_reward(chat, prompts=["q1", "q2"], completion_ids=[[1], [2]], answer=["5", "5"])
    assert scores == [1.0, 0.0]


def test_prefilled_think_in_prompt():
    completion = "reasoning here</think><answer>5</answer>"
    assert format_reward([completion], prompts=["Question: 2+3?\nAssistant: <think>"]) == [1.0]
    assert format_reward([completion], prompts=["Question: 2+3?\nAssistant:"]) == [0.0]


def test_hostile_inputs_are_fast_and_score_zero():
    hostile = ["<think>" + "{" * 2_000_000, "<think>a</think>\\boxed{5}" + "$\\]" * 1000 + "x", b"\xff<think>a</think>\xfe",
               "<think>a</think>" + "\\boxed{" * 100_000]
    start = time.monotonic()
    assert format_reward(hostile) == [0.0] * 4
    assert time.monotonic() - start < 20  # linear scans: well under a second; quadratic ones take hours


def test_the_embedded_defaults_completions():
    """Worked chain solutions are in format; the cold-start set's direct answers (empty think) are not."""
    from grpo_core.data.synthetic import format_solution, make_chain_rows, make_cold_start_rows

    assert format_reward(["<think>7+8=15;15*3=45;45-5=40</think><answer>40</answer>"]) == [1.0]
    assert format_reward(["<think></think><answer>40</answer>"]) == [0.0]
    assert format_solution([7, 8, 3, 5], ["+", "*", "-"], with_reasoning=False) == "<think></think><answer>40</answer>"
    sft = make_cold_start_rows(make_chain_rows(40, seed=3), direct_fraction=0.5, seed=3)
    direct = [r["completion"].startswith("<think></think>") for r in sft]
    assert 0 < sum(direct) < 40
    assert format_reward([r["completion"] for r in sft], prompts=[r["prompt"] for r in sft]) == [
        0.0 if d else 1.0 for d in direct
    ]
