"""Shaping rewards against hand-computed values: DAPO eq. 13 and R1's language consistency."""

from __future__ import annotations

import time

import pytest

from grpo_core.rewards import get_reward_funcs
from grpo_core.rewards.shaping import (
    count_script_units,
    language_consistency,
    make_overlong_penalty,
    overlong_penalty,
    soft_overlong_penalty,
)


def ids(n: int) -> list[int]:
    return [7] * n


def test_soft_overlong_penalty_follows_dapo_eq13() -> None:
    # L_max = 20, L_cache = 4: free up to 16 tokens, then linear to -1 at 20, -1 beyond
    expected = {0: 0.0, 10: 0.0, 16: 0.0, 17: -0.25, 18: -0.5, 19: -0.75, 20: -1.0, 21: -1.0, 100: -1.0}
    for length, value in expected.items():
        assert soft_overlong_penalty(length, 20, 4) == pytest.approx(value), length


def test_overlong_penalty_reward_uses_trainer_kwargs() -> None:
    lengths = [5, 16, 18, 20]
    # default buffer: a fifth of max_completion_length (DAPO's 4096 of 20480) -> 4 of 20
    assert overlong_penalty(["a"] * 4, completion_ids=[ids(n) for n in lengths], max_completion_length=20) == [
        0.0, 0.0, -0.5, -1.0,
    ]
    fixed = make_overlong_penalty(max_completion_length=10, overlong_buffer=5)
    assert fixed(["a"] * 4, completion_ids=[ids(n) for n in [5, 6, 8, 10]], max_completion_length=999) == [
        0.0, -0.2, -0.6, -1.0,
    ]
    with pytest.raises(ValueError, match="completion_ids and max_completion_length"):
        overlong_penalty(["a"])
    with pytest.raises(ValueError, match="overlong_buffer"):
        make_overlong_penalty(10, 11)
    assert [f.__name__ for f in get_reward_funcs(["overlong_penalty", "language_consistency"])] == [
        "overlong_penalty", "language_consistency",
    ]


def test_script_units_ignore_math_code_markup_digits() -> None:
    text = "<think>设 $x^2+1$ 为 \\frac{1}{2}</think> `code here` ```python\nprint('hello world')\n``` 42, 3.14!"
    assert count_script_units(text) == {"cjk": 2}  # 设, 为
    assert count_script_units("The answer is x = 5") == {"latin": 3}  # single-letter x is a variable
    assert count_script_units("Привет мир") == {"cyrillic": 2}
    assert count_script_units("مرحبا بالعالم") == {"arabic": 2}
    assert count_script_units("नमस्ते दुनिया") == {"devanagari": 2}  # combining vowel signs stay in the word
    assert count_script_units("안녕하세요 세계") == {"hangul": 2}
    assert count_script_units("ひらがなと漢字") == {"cjk": 7}


def test_language_consistency_hand_computed() -> None:
    zh_prompt = [{"role": "system", "content": "You are a helpful assistant."},
                 {"role": "user", "content": "请计算一加一等于多少？"}]
    en_prompt = "What is one plus one?"
    completions = [
        "答案是 two",  # 3 CJK chars + 1 Latin word -> 3/4
        [{"role": "assistant", "content": "一加一等于二，所以答案是 $2$。"}],  # all Chinese, math ignored -> 1
        "The answer is two.",  # English prompt, English answer -> 1
        "The answer is 答案",  # 3 Latin words + 2 CJK chars -> 3/5
        "Ответ два",  # Cyrillic for an English prompt -> 0
        "$1 + 1 = 2$",  # no words at all -> 1
    ]
    prompts = [zh_prompt, zh_prompt, en_prompt, en_prompt, en_prompt, en_prompt]
    scores = language_consistency(completions, prompts=prompts)
    assert scores == pytest.approx([0.75, 1.0, 1.0, 0.6, 0.0, 1.0])
    assert language_consistency(["two"], prompts=["$1+1$ = ?"]) == [None]  # no language in the prompt


def test_language_consistency_is_fast_on_huge_adversarial_text() -> None:
    start = time.monotonic()
    huge = "\\[" * 200_000 + "$$" * 100_000 + "词 word " * 100_000
    assert language_consistency([huge], prompts=["hello there"])[0] is not None
    assert time.monotonic() - start < 20  # linear: well under a second; a quadratic scan takes hours
