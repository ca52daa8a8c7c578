"""math_accuracy against the labels of real data (../shared/data), with the seed's regex baseline beside it.

Run: python -m pytest tests/grpo_core/rewards/test_math_accuracy.py -q -s   (-s prints the agreement table)
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from grpo_core.rewards import math_accuracy, pop_reward_stats
from grpo_core.rewards import math as math_reward
from grpo_core.rewards.extract import seed_math_reward
from grpo_core.rewards.math import VerifyOptions, verify_texts

os.environ.setdefault("OMP_NUM_THREADS", "1")
AGREEMENT_MIN = 0.99


@dataclass
class Case:
    completion: str
    gold: str
    label: float  # the data set's verdict: 1.0 correct, 0.0 wrong
    source: str = ""


@dataclass
class Agreement:
    name: str
    n: int = 0
    ours: int = 0
    seed: int = 0
    misses: list[tuple[str, str, float, float]] = field(default_factory=list)

    def row(self) -> str:
        return f"{self.name:<34} {self.n:>6} {self.ours / self.n:>8.2%} {self.seed / self.n:>8.2%}"


def _header() -> str:
    return f"{'data set':<34} {'cases':>6} {'ours':>8} {'seed':>8}"


def _score(name: str, cases: list[Case], ours: list[float | None]) -> Agreement:
    agg = Agreement(name, n=len(cases))
    for case, score in zip(cases, ours, strict=True):
        agg.ours += int(score == case.label)
        agg.seed += int(seed_math_reward(case.completion, case.gold) == case.label)
        if score != case.label:
            agg.misses.append((case.gold[:80], case.completion[-160:], case.label, float(score or 0.0)))
    return agg


def _report(aggs: list[Agreement]) -> str:
    lines = [_header(), *(a.row() for a in aggs)]
    for a in aggs:
        for gold, tail, label, got in a.misses[:5]:
            lines.append(f"  miss [{a.name}] gold={gold!r} label={label} ours={got} tail={tail!r}")
    text = "\n".join(lines)
    print("\n" + text)
    return text


# -- data sets -> labelled cases -------------------------------------------------------------------------


def _gsm8k_gold(row: dict[str, Any]) -> str:
    return row["answer"].rsplit("####", 1)[1].strip().replace(",", "")


def gsm8k_gold_cases(data: Path) -> list[Case]:
    """GSM8K gold answers written as a model would, right (label 1) and off by one (label 0)."""
    rows = [json.loads(line) for line in (data / "gsm8k_test.jsonl").open()]
    cases = []
    for row in rows:
        gold = _gsm8k_gold(row)
        shown = f"{int(gold):,}" if gold.lstrip("-").isdigit() else gold  # 1,000 as models write it
        wrong = str(int(gold) + 1) if gold.lstrip("-").isdigit() else gold + "1"
        cases += [
            Case(f"Let me compute step by step. ... so the total is {gold}.\n\\boxed{{{gold}}}", gold, 1.0),
            Case(f"<think>reasoning about 3 and 4</think>\n<answer>{shown}</answer>", gold, 1.0),
            Case(f"First 2 + 3 = 5. Then more steps.\nThe answer is ${shown}.", gold, 1.0),
            Case(f"Adding up gives 7 apples.\nThe answer is {wrong}.", gold, 0.0),
            Case(f"The first try gave \\boxed{{{gold}}}, but checking again: \\boxed{{{wrong}}}", gold, 0.0),
        ]
    return cases


def math500_gold_cases(data: Path) -> list[Case]:
    """MATH-500 LaTeX gold answers in a box / <answer> tag (label 1) and another problem's answer (label 0)."""
    rows = json.loads((data / "math500_test.json").read_text())
    cases = []
    for i in range(len(rows)):
        gold = rows[i]["answer"]
        styled = gold.replace("\\frac", "\\dfrac").replace(", ", ",")  # same answer, other spelling
        cases += [
            Case(f"Thus the answer is $\\boxed{{{gold}}}$.", gold, 1.0),
            Case(f"<think>...</think>\n<answer>{styled}</answer>", gold, 1.0),
            Case(f"So we get\n\\[\\boxed{{{styled}}}\\]", gold, 1.0),
        ]
        other = rows[(i + 1) % len(rows)]["answer"]
        g, o = "".join(gold.split()), "".join(other.split())
        if g not in o and o not in g:  # skip look-alikes such as 5 vs x=5 (same answer)
            cases.append(Case(f"Therefore the answer is $\\boxed{{{other}}}$.", gold, 0.0))
    return cases


def gpt3_solution_cases(data: Path) -> list[Case]:
    """GPT-3 GSM8K solutions (4 models per problem) with OpenAI's ``is_correct``; gold from the test split."""
    golds = {r["question"]: _gsm8k_gold(r) for r in map(json.loads, (data / "gsm8k_test.jsonl").open())}
    rows = [json.loads(line) for line in (data / "gsm8k_example_model_solutions.jsonl").open()]
    cases = []
    for row in rows:
        for key in ("6b_finetuning", "6b_verification", "175b_finetuning", "175b_verification"):
            sol = row[key]
            cases.append(Case(sol["solution"], golds[row["question"]], float(sol["is_correct"]), key))
    return cases


def qwen_math_cases(data: Path) -> list[Case]:
    """Qwen2.5-Math chain-of-thought outputs on MATH with the ``score`` of Qwen's own grader."""
    rows = [json.loads(line) for line in (data / "qwen25math_math_cot_100_outputs.jsonl").open()]
    return [
        Case(resp, str(row["gt"]), float(score), row["idx"])
        for row in rows
        for resp, score in zip(row["code"], row["score"], strict=True)
    ]


def verify_case_rows(data: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in (data / "verify_cases.jsonl").open()]


def _options(row: dict[str, Any]) -> VerifyOptions:
    o = row["options"]
    types = o["match_types"]
    return VerifyOptions(
        match_types=("library_default",) if types == "library_default" else tuple(types),
        precision=int(o["precision"]),
        strict=bool(o["strict"]),
        allow_set_relation_comp=bool(o["allow_set_relation_comp"]),
    )


# -- tests ---------------------------------------------------------------------------------------------


@pytest.fixture(scope="module", autouse=True)
def _two_workers():
    settings = math_reward.configure(timeout=5.0, num_workers=2)
    yield settings
    pop_reward_stats()


def _agreement_on_labelled(data: Path) -> list[Agreement]:
    builders = {
        "gsm8k gold as model answers": gsm8k_gold_cases,
        "math500 gold as model answers": math500_gold_cases,
        "gsm8k gpt-3 solutions (is_correct)": gpt3_solution_cases,
        "qwen2.5-math math outputs (score)": qwen_math_cases,
    }
    aggs = []
    for name, build in builders.items():
        cases = build(data)
        ours = math_accuracy([c.completion for c in cases], answer=[c.gold for c in cases])
        aggs.append(_score(name, cases, ours))
    return aggs


def _agreement_on_verify_cases(data: Path) -> list[Agreement]:
    """Math-Verify's own suite: ours = the bounded pool with each case's options (match types, precision...).

    Also shown: math_accuracy's extraction (last box / answer / number) on the same predictions, which by
    design differs where a case expects several boxes to be joined or a relation to be read from prose.
    """
    rows = verify_case_rows(data)
    by_opts: dict[VerifyOptions, list[int]] = {}
    for i, row in enumerate(rows):
        by_opts.setdefault(_options(row), []).append(i)
    scores: list[float] = [0.0] * len(rows)
    for opts, idx in by_opts.items():
        got = verify_texts([rows[i]["gold"] for i in idx], [rows[i]["pred"] for i in idx], options=opts)
        for i, s in zip(idx, got):
            scores[i] = s
    cases = [Case(r["pred"], r["gold"], float(r["expected"]), r["id"]) for r in rows]
    raw = _score("math-verify cases (with options)", cases, scores)
    as_reward = math_accuracy([c.completion for c in cases], answer=[c.gold for c in cases])
    extracted = _score("math-verify cases via math_accuracy", cases, as_reward)
    return [raw, extracted]


def test_acceptance_example():
    assert math_accuracy(["... \\boxed{\\frac{1}{2}}"], answer=["0.5"]) == [1.0]
    assert math_accuracy([[{"role": "assistant", "content": "<answer>1,000</answer>"}]], answer=["1000"]) == [1.0]
    assert math_accuracy(["\\boxed{2}", "x"], answer=[None, "3"]) == [None, 0.0]


def test_agreement_with_real_labels(shared_data: Path):
    """Every row of every data set (about 15 s on 2 cores with 2 workers).

    Known disagreements, all on Qwen2.5-Math outputs (3 of 800), none a bug of extraction:
    - two responses box the right answer and then emit ~8,000 characters of degenerate text; only the last
      4,000 characters are parsed (``MAX_TAIL_CHARS``), so they score 0 where Qwen's grader says correct.
      Deliberate: rewarding an answer buried under garbage would reinforce the garbage.
    - gold ``10{,}000`` vs ``\\boxed{10000}`` is labelled wrong by Qwen's grader; the label is wrong.
    """
    aggs = _agreement_on_labelled(shared_data) + _agreement_on_verify_cases(shared_data)
    report = _report(aggs)
    for a in aggs:
        if a.name != "math-verify cases via math_accuracy":  # informational, see _agreement_on_verify_cases
            assert a.ours / a.n >= AGREEMENT_MIN, report
        assert a.ours >= a.seed, report  # never worse than the seed's regex baseline...
    assert sum(a.ours for a in aggs) > sum(a.seed for a in aggs) + 1000, report  # ...and far better overall
