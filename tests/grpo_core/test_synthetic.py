"""The built-in chain task: left-to-right arithmetic with worked steps, deterministic by seed."""

from __future__ import annotations

import re

import pytest

from grpo_core.data.synthetic import (
    chain_accuracy,
    chain_format,
    chain_steps,
    evaluate_chain,
    format_solution,
    make_chain_rows,
    make_chain_splits,
    make_cold_start_rows,
    parse_chain_completion,
)
from grpo_core.evaluation.heldout import is_direct
from grpo_core.rewards import get_reward_funcs


def test_left_to_right_not_precedence():
    assert evaluate_chain("7+8*3-5=") == 40  # ((7+8)*3)-5, precedence would give 26
    assert evaluate_chain("9-9*4+2") == 2
    assert chain_steps([7, 8, 3, 5], ["+", "*", "-"]) == ["7+8=15", "15*3=45", "45-5=40"]
    assert format_solution([7, 8, 3, 5], ["+", "*", "-"]) == "<think>7+8=15;15*3=45;45-5=40</think><answer>40</answer>"
    assert format_solution([7, 8, 3, 5], ["+", "*", "-"], with_reasoning=False) == "<think></think><answer>40</answer>"


def test_rows_schema_ranges_and_determinism():
    rows = make_chain_rows(300, seed=5)
    assert rows == make_chain_rows(300, seed=5)
    assert rows != make_chain_rows(300, seed=6)
    assert len({r["prompt"][0]["content"] for r in rows}) == 300
    counts = set()
    for r in rows:
        assert set(r) == {"id", "prompt", "answer", "task", "source"}
        assert r["task"] == "chain" and r["source"] == "chain"
        (msg,) = r["prompt"]
        assert msg["role"] == "user"
        text = msg["content"]
        assert re.fullmatch(r"[1-9]([-+*][1-9]){2,3}=", text), text
        counts.add(len(text) // 2)
        value = int(text[0])
        for op, b in zip(text[1:-1:2], text[2:-1:2]):
            value = {"+": value + int(b), "-": value - int(b), "*": value * int(b)}[op]
            assert 0 <= value <= 99, text
        assert r["answer"] == str(value)
    assert counts == {3, 4}  # both 3 and 4 operands occur


def test_splits_are_disjoint():
    train, test = make_chain_splits(500, 100, seed=1)
    assert len(train) == 500 and len(test) == 100
    assert not {r["prompt"][0]["content"] for r in train} & {r["prompt"][0]["content"] for r in test}
    assert not {r["id"] for r in train} & {r["id"] for r in test}


def test_cold_start_direct_fraction_and_correctness():
    rows = make_chain_rows(400, seed=2)
    sft = make_cold_start_rows(rows, direct_fraction=0.5, seed=2)
    assert sft == make_cold_start_rows(rows, direct_fraction=0.5, seed=2)
    direct = [is_direct(s["completion"]) for s in sft]
    assert 0.4 < sum(direct) / len(direct) < 0.6
    assert chain_accuracy([s["completion"] for s in sft], answer=[r["answer"] for r in rows]) == [1.0] * 400
    assert not any(is_direct(s["completion"]) for s in make_cold_start_rows(rows, direct_fraction=0.0))
    assert all(is_direct(s["completion"]) for s in make_cold_start_rows(rows, direct_fraction=1.0))
    with pytest.raises(ValueError):
        make_cold_start_rows(rows, direct_fraction=1.5)


def test_coarse_steps_do_two_operations_a_step():
    assert chain_steps([7, 8, 3, 5], ["+", "*", "-"], ops_per_step=2) == ["7+8*3=45", "45-5=40"]
    assert chain_steps([7, 8, 3], ["+", "*"], ops_per_step=2) == ["7+8*3=45"]
    assert format_solution([2, 3, 4, 5, 6], list("+*-+"), ops_per_step=2) == \
        "<think>2+3*4=20;20-5+6=21</think><answer>21</answer>"


def test_cold_start_mixes_direct_coarse_and_fine_rows_by_fraction():
    rows = make_chain_rows(600, seed=3)
    sft = make_cold_start_rows(rows, direct_fraction=0.4, coarse_fraction=0.3, seed=3)
    assert chain_accuracy([s["completion"] for s in sft], answer=[r["answer"] for r in rows]) == [1.0] * 600

    def ops_in_first_step(completion: str) -> int:
        first = parse_chain_completion(completion)[0].split(";")[0].split("=")[0]
        return sum(first.count(c) for c in "+-*")

    kinds = ["direct" if is_direct(s["completion"]) else "coarse" if ops_in_first_step(s["completion"]) == 2 else "fine"
             for s in sft]
    assert 0.33 < kinds.count("direct") / 600 < 0.47
    assert 0.23 < kinds.count("coarse") / 600 < 0.37
    assert 0.23 < kinds.count("fine") / 600 < 0.37
    # without coarse rows the draw is the one it always was: the same direct rows as before
    assert make_cold_start_rows(rows, direct_fraction=0.4, seed=3) == \
        make_cold_start_rows(rows, direct_fraction=0.4, coarse_fraction=0.0, seed=3)
    with pytest.raises(ValueError, match="at most 1"):
        make_cold_start_rows(rows, direct_fraction=0.6, coarse_fraction=0.5)


def test_reward_is_strict():
    good = "<think>7+8=15;15*3=45;45-5=40</think><answer>40</answer>"
    comps = [good, "<think></think><answer>40</answer>", good.replace("40</answer>", "41</answer>"),
             "<answer>40</answer>", good + "x", "<think>a</think><think>b</think><answer>40</answer>",
             [{"role": "assistant", "content": good}]]
    assert chain_accuracy(comps, answer=["40"] * len(comps)) == [1.0, 1.0, 0.0, 0.0, 0.0, 0.0, 1.0]
    assert chain_format(comps) == [1.0, 1.0, 1.0, 0.0, 0.0, 0.0, 1.0]
    assert parse_chain_completion(good) == ("7+8=15;15*3=45;45-5=40", "40")
    assert get_reward_funcs(["chain_accuracy"]) == [chain_accuracy]
    assert chain_accuracy(["x"]) == [None]
