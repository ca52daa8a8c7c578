"""Checking measured as checking (issue 42): a reflection phrase counts as a check only after a miss and before
another try; a word alone, a template that never stops, a ``wait`` after a hit are counted apart."""

from __future__ import annotations

import math
import random

import pytest

from grpo_core.data.countdown import (
    CHECK_STYLES,
    RETRY_ORDERS,
    make_countdown_rows,
    parse_prompt,
    teacher_trace,
    try_steps,
)
from grpo_core.evaluation.checking import CHECKING_KEYS, checking_stats, has_tries
from grpo_core.rewards.base import prompt_text

P = [{"role": "user", "content": "3,8,5->13:"}]  # 8+5 is the one try that reaches 13
COMPARE = "<think>3+8=11?13;wait;3+5=8?13;wait;8+5=13?13</think><answer>8+5</answer>"  # checks, retries, stops
WAIT = "<think>3+8=11;wait, 11!=13;8+5=13</think><answer>8+5</answer>"


def stats(*texts: str, prompt=P) -> dict[str, float]:
    return checking_stats(list(texts), [prompt] * len(texts))


def test_try_steps_pair_each_try_with_what_follows_it():
    assert try_steps(COMPARE, P) == [(False, "11?13;wait"), (False, "8?13;wait"), (True, "13?13")]
    assert try_steps(WAIT, P) == [(False, "11;wait, 11!=13"), (True, "13")]
    assert try_steps("<think>hm;wait</think><answer>8+5</answer>", P) == []  # no try: nothing before one is kept
    assert try_steps("<think>8+5=12</think><answer>8+5</answer>", P) == [(True, "12")]  # the hit is computed
    assert try_steps(WAIT, "1+2+3=") is None


def test_try_steps_find_every_teacher_traces_tries():
    """Every teacher style and order: an unchecked trace is one try; a checked one misses until its last try, which
    reaches the target."""
    rng = random.Random(0)
    for row in make_countdown_rows(20, seed=1):
        numbers, target = parse_prompt(prompt_text(row["prompt"]))
        for check in (False, True):
            for order in RETRY_ORDERS:
                for style in CHECK_STYLES:
                    text = teacher_trace(numbers, target, "+", rng, check=check, retry_order=order, check_style=style)
                    hits = [hit for hit, _ in try_steps(text, row["prompt"])]
                    if check:
                        assert hits[-1] and not any(hits[:-1]), text
                    else:
                        assert len(hits) == 1, text


def test_first_tries_retries_and_tries_per_response_are_counted():
    p = [{"role": "user", "content": "3,8,5->13:"}]
    s = checking_stats(["<think>3+8=11?13;wait;3+5=8?13;wait;8+5=13?13</think><answer>8+5</answer>",
                        "<think>3+8=11?13;wait;8+5=13?13</think><answer>8+5</answer>",
                        "<think>8+5=13</think><answer>8+5</answer>", "<think></think><answer>3+8</answer>"], [p] * 4)
    assert s["tries_per_response"] == (3 + 2 + 1 + 0) / 4
    assert s["first_try_hit_rate"] == 1 / 3  # of the responses with a try
    assert s["retries"] == 3 and s["retry_hit_rate"] == 2 / 3  # 3+5 after a miss, 8+5 twice
    assert try_steps("<think>9+4=13</think><answer>9+4</answer>", p) == [(False, "13")]  # not the prompt's numbers


def test_a_check_and_retry_after_a_miss_counts_in_both_teacher_styles():
    for text in (COMPARE, WAIT):
        s = stats(text)
        assert s["checking_rate"] == 1.0 and s["miss_retry_rate"] == 1.0 and s["hit_stop_rate"] == 1.0
        assert s["reflection_after_hit_rate"] == 0.0 and s["reflection_without_try_rate"] == 0.0
    s = stats(COMPARE)
    assert s["first_try_hit_rate"] == 0.0 and s["retries"] == 2 and s["retry_hit_rate"] == 0.5


def test_a_wait_with_no_try_is_not_checking():
    s = stats("<think>wait</think><answer>8+5</answer>")
    assert s["checking_rate"] == 0.0 and s["reflection_without_try_rate"] == 1.0
    assert math.isnan(s["miss_retry_rate"]) and math.isnan(s["hit_stop_rate"]) and math.isnan(s["first_try_hit_rate"])


def test_a_retry_without_a_phrase_is_blind_and_a_miss_the_response_ends_on_is_unchecked():
    s = stats("<think>3+8=11?13;8+5=13?13</think><answer>8+5</answer>",  # the comparison alone is not the check
              "<think>3+8=11;wait</think><answer>3+8</answer>")  # checked, never retried
    assert s["checking_rate"] == 0.0 and s["miss_retry_rate"] == 0.0
    assert s["retries"] == 1 and s["retry_hit_rate"] == 1.0  # a retry all the same


def test_a_template_that_never_stops_after_a_hit_lowers_hit_stop_and_reflects_after_the_hit():
    """Three tries whatever they find: with the hit first or in the middle the response goes on past it."""
    template = ["<think>8+5=13;wait;3+8=11;wait;3+5=8</think><answer>3+5</answer>",
                "<think>3+8=11;wait;8+5=13;wait;3+5=8</think><answer>3+5</answer>",
                "<think>3+8=11;wait;3+5=8;wait;8+5=13</think><answer>8+5</answer>"]
    s = stats(*template)
    assert s["hit_stop_rate"] == pytest.approx(1 / 3) and s["reflection_after_hit_rate"] == pytest.approx(2 / 3)
    assert s["miss_retry_rate"] == pytest.approx(4 / 6)  # the first two end on a miss, never retried
    assert stats(COMPARE, WAIT)["hit_stop_rate"] == 1.0


def test_a_wait_after_a_hit_counts_apart():
    s = stats("<think>8+5=13;wait</think><answer>8+5</answer>", "<think>8+5=13</think><answer>8+5</answer>")
    assert s["reflection_after_hit_rate"] == 0.5 and s["checking_rate"] == 0.0 and s["hit_stop_rate"] == 1.0
    assert s["first_try_hit_rate"] == 1.0 and math.isnan(s["miss_retry_rate"])
    later = stats("<think>8+5=13;3+8=11;wait;3+5=8</think><answer>3+5</answer>")  # the wait follows a later miss
    assert later["reflection_after_hit_rate"] == 1.0 and later["checking_rate"] == 1.0 and later["hit_stop_rate"] == 0.0


def test_nan_where_nothing_is_counted_and_other_prompts_left_out():
    empty = checking_stats([], [])
    assert all(math.isnan(empty[k]) for k in CHECKING_KEYS) and empty["retries"] == 0 and empty["responses"] == 0
    s = checking_stats([COMPARE, "<think>1+2=3;3+3=6</think><answer>6</answer>"], [P, "1+2+3="])
    assert s["responses"] == 1 and s["checking_rate"] == 1.0  # the chain prompt is not counted
    assert has_tries([P]) and not has_tries(["1+2+3="]) and not has_tries([])
    with pytest.raises(ValueError, match="one each"):
        checking_stats([COMPARE], [])


def test_custom_phrases_are_the_checks():
    assert stats(WAIT, "<think>3+8=11;hmm;8+5=13</think>")["checking_rate"] == 0.5
    custom = checking_stats(["<think>3+8=11;hmm;8+5=13</think>"], [P], reflection_phrases=["hmm"])
    assert custom["checking_rate"] == 1.0
