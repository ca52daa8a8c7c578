"""The built-in countdown task: problems with exactly one right try, the teacher's traces, the verifying reward."""

from __future__ import annotations

import pytest

from grpo_core.config import REFLECTION_PHRASES
from grpo_core.data.countdown import (
    CHECK_STYLES,
    RETRY_ORDERS,
    candidates,
    countdown_accuracy,
    evaluate_expression,
    make_countdown_cold_start,
    make_countdown_rows,
    make_countdown_splits,
    parse_prompt,
)
from grpo_core.evaluation.emergence import has_phrase, reasoning_text
from grpo_core.rewards import get_reward_funcs
from grpo_core.rewards.base import prompt_text


def _score(completion: str, prompt: str = "3,8,5->13:") -> float | None:
    return countdown_accuracy([completion], prompts=[[{"role": "user", "content": prompt}]])[0]


def test_reward_verifies_numbers_and_target():
    assert _score("<think>3+8=11;wait, 11!=13;8+5=13</think><answer>8+5</answer>") == 1.0
    assert _score("<think></think><answer>5+8</answer>") == 1.0  # either order
    assert _score("<think>3+8=11</think><answer>3+8</answer>") == 0.0  # uses the numbers, misses the target
    assert _score("<think></think><answer>13+0</answer>") == 0.0  # reaches the target with a number not given
    assert _score("<think></think><answer>8+5</answer>", "3,8,8->16:") == 0.0
    assert _score("<think></think><answer>8+8</answer>", "3,8,8->16:") == 1.0  # a number given twice, used twice
    assert _score("<think></think><answer>8+8</answer>", "3,8,5->16:") == 0.0  # given once, used twice
    # only the row's operators (issue 42): `2,2,5->4:` answered `2*2` reaches 4 with an operator the task lacks
    assert _score("<think></think><answer>8*2</answer>", "3,8,2->16:") == 0.0
    assert _score("<think></think><answer>2*2</answer>", "2,2,5->4:") == 0.0
    assert _score("<think></think><answer>2+2</answer>", "2,2,5->4:") == 1.0
    prompts = [[{"role": "user", "content": "3,8,2->16:"}]] * 3
    assert countdown_accuracy(["<think></think><answer>8*2</answer>"] * 3, prompts=prompts,
                              operators=["+*", "+", None]) == [1.0, 0.0, 0.0]  # None: the default "+"
    assert _score("8+5") == 0.0 and _score("<think>8+5=13</think><answer>8+5</answer>.") == 0.0  # format
    assert _score("<think></think><answer>8+5</answer>", "7+8*3=") is None  # not a countdown prompt
    assert get_reward_funcs(["countdown_accuracy"])[0] is countdown_accuracy


def test_rows_have_exactly_one_right_try_and_are_deterministic():
    rows = make_countdown_rows(300, seed=4)
    assert rows == make_countdown_rows(300, seed=4) and rows != make_countdown_rows(300, seed=5)
    assert len({r["prompt"][0]["content"] for r in rows}) == 300
    for r in rows:
        assert set(r) == {"id", "prompt", "answer", "task", "source", "operators"} and r["source"] == "countdown"
        numbers, target = parse_prompt(r["prompt"][0]["content"])
        assert len(numbers) == 3 and all(1 <= n <= 12 for n in numbers) and r["answer"] == str(target)
        assert r["operators"] == "+"
        right = [e for e in candidates(numbers, "+") if evaluate_expression(e) == target]
        assert len(right) == 1


def test_splits_are_disjoint():
    train, ev = make_countdown_splits(2000, 100, seed=0)
    assert len(ev) == 100 and len(train) == 2000
    assert not {r["prompt"][0]["content"] for r in ev} & {r["prompt"][0]["content"] for r in train}


@pytest.mark.parametrize("fraction", [0.0, 0.05, 1.0])
def test_cold_start_checks_only_the_share_asked_for(fraction):
    rows = make_countdown_rows(1000, seed=1)
    cold = make_countdown_cold_start(rows, check_fraction=fraction, seed=1)
    scores = countdown_accuracy([c["completion"] for c in cold], prompts=[c["prompt"] for c in cold])
    reflective = [has_phrase(reasoning_text(c["completion"]), REFLECTION_PHRASES) for c in cold]
    if fraction == 1.0:
        assert all(s == 1.0 for s in scores)  # checking every try always ends at the right one
    else:
        assert 0.25 < sum(scores) / len(scores) < 0.45  # the unchecked first try: right about a third of the time
    assert sum(reflective) / len(cold) == pytest.approx(fraction * 2 / 3, abs=0.04)  # a wait only after a wrong try
    for c, s in zip(cold, scores):
        if "wait" in c["completion"]:
            assert s == 1.0
    assert make_countdown_cold_start(rows, check_fraction=fraction, seed=1) == cold


def test_systematic_retries_take_the_tries_in_the_prompts_order():
    rows = make_countdown_rows(300, seed=2)
    cold = make_countdown_cold_start(rows, check_fraction=1.0, seed=2, retry_order="systematic")
    assert countdown_accuracy([c["completion"] for c in cold], prompts=[c["prompt"] for c in cold]) == [1.0] * 300
    for row, c in zip(rows, cold):
        numbers, target = parse_prompt(prompt_text(row["prompt"]))
        steps = reasoning_text(c["completion"]).split(";")
        tried = [step.split("=")[0] for step in steps if not step.startswith("wait")]
        assert tried == candidates(numbers, "+")[:len(tried)]  # the first tries in order, up to the right one
    unchecked = make_countdown_cold_start(rows, check_fraction=0.0, seed=2, retry_order="systematic")
    firsts = [reasoning_text(c["completion"]).split("=")[0] for c in unchecked]
    assert sum(f == candidates(parse_prompt(prompt_text(r["prompt"]))[0], "+")[0] for f, r in zip(firsts, rows)) < 150
    with pytest.raises(ValueError, match="retry_order must be one of"):
        make_countdown_cold_start(rows, retry_order="sorted")


def test_compare_checks_write_the_target_beside_every_try_and_stop_at_the_right_one():
    rows = make_countdown_rows(300, seed=3)
    cold = make_countdown_cold_start(rows, check_fraction=0.5, seed=3, retry_order="systematic",
                                     check_style="compare")
    scores = countdown_accuracy([c["completion"] for c in cold], prompts=[c["prompt"] for c in cold])
    checked = 0
    for row, c, score in zip(rows, cold, scores):
        numbers, target = parse_prompt(prompt_text(row["prompt"]))
        steps = reasoning_text(c["completion"]).split(";")
        if "?" not in c["completion"]:
            assert len(steps) == 1 and "wait" not in c["completion"]  # unchecked: the first try, committed
            continue
        checked += 1
        tries = steps[::2]
        assert steps[1::2] == ["wait"] * (len(tries) - 1) and score == 1.0
        assert [t.split("?")[1] for t in tries] == [str(target)] * len(tries)  # the target beside every value
        values = [int(t.split("=")[1].split("?")[0]) for t in tries]
        assert values[-1] == target and target not in values[:-1]  # stops at the first try that reaches it
        assert has_phrase(reasoning_text(c["completion"]), REFLECTION_PHRASES) == (len(tries) > 1)
    assert 100 < checked < 200
    with pytest.raises(ValueError, match="check_style must be one of"):
        make_countdown_cold_start(rows, check_style="loud")


def test_prepare_data_builds_the_countdown_task_beside_the_chain():
    """data.countdown: distinct training prompts, none held out; cold-start and pretraining traces in the configured
    style, none on a held-out prompt; the pretraining tries only when a base is pretrained."""
    from pydantic import ValidationError

    from grpo_core.config import CountdownData, DataConfig
    from grpo_core.recipe.prepare import prepare_datasets

    cfg = {"num_train": 300, "num_eval": 40, "cold_start_size": 400, "check_fraction": 0.25, "pretrain_size": 500,
           "pretrain_check_fraction": 0.5}
    data = prepare_datasets(DataConfig(num_train=50, num_eval=10, cold_start_size=20, pretrain_size=30, countdown=cfg))
    train = [r for r in data.train if r["source"] == "countdown"]
    held = {prompt_text(r["prompt"]) for r in data.eval if r["source"] == "countdown"}
    assert len(train) == 300 and len({prompt_text(r["prompt"]) for r in train}) == 300 and len(held) == 40
    assert not held & {prompt_text(r["prompt"]) for r in train}
    cold = [r for r in data.cold_start if r["source"] == "countdown"]
    assert len(cold) == 400 and not held & {prompt_text(r["prompt"]) for r in cold}
    pre = [r for r in data.pretrain if parse_prompt(prompt_text(r["prompt"]))]
    assert len(pre) == 500 and not held & {prompt_text(r["prompt"]) for r in pre}

    def checked(rows):
        return sum("?" in r["completion"] for r in rows) / len(rows)  # compare style: the target beside each value

    assert 0.15 < checked(cold) < 0.35 and 0.4 < checked(pre) < 0.6
    assert all(has_phrase(reasoning_text(r["completion"]), REFLECTION_PHRASES) for r in cold
               if r["completion"].count("?") > 1)  # a retry says wait
    assert countdown_accuracy([r["completion"] for r in cold if "?" in r["completion"]],
                              prompts=[r["prompt"] for r in cold if "?" in r["completion"]]) == \
        [1.0] * sum("?" in r["completion"] for r in cold)  # a checked trace stops at the target
    unpretrained = prepare_datasets(DataConfig(num_train=50, num_eval=10, cold_start_size=20,
                                               countdown={**cfg, "pretrain_size": 0}))
    assert not unpretrained.pretrain
    with pytest.raises(ValidationError, match=r"data.countdown.pretrain_size \(500\).*set data.pretrain_size"):
        DataConfig(countdown=cfg)
    assert CountdownData.model_fields["retry_order"].annotation.__args__ == RETRY_ORDERS
    assert CountdownData.model_fields["check_style"].annotation.__args__ == CHECK_STYLES
