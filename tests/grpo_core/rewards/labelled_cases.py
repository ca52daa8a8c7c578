"""Labelled (completion, gold, verdict) cases built from the real data sets in ../shared/data, and plain
math-verify's verdicts on them: shared by ``test_math_accuracy.py`` and ``tests/benchmarks/verify_agreement.py``.

Every builder takes the data folder and returns ``Case``s whose ``label`` is the data set's verdict (or, for the
gold-as-completion sets, 1.0: an answer always equals itself).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable


@dataclass
class Case:
    completion: str
    gold: str
    label: float  # the data set's verdict: 1.0 correct, 0.0 wrong
    source: str = ""


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


def verify_cases(data: Path) -> list[Case]:
    """Math-Verify's own test cases as a user calls them: (pred, gold, expected), each case's options ignored."""
    return [Case(r["pred"], r["gold"], float(r["expected"]), r["id"]) for r in verify_case_rows(data)]


def verify_gold_self_cases(data: Path) -> list[Case]:
    """Every gold answer of verify_cases.jsonl, as written, as the completion against itself (label 1)."""
    golds = dict.fromkeys(r["gold"] for r in verify_case_rows(data))
    return [Case(g, g, 1.0, "verify_cases gold") for g in golds]


MATH500_WRITTEN = {"$...$": "${}$", "$$...$$": "$${}$$", "\\boxed{...}": "\\boxed{{{}}}"}


def math500_gold_self_cases(data: Path) -> list[Case]:
    """Every MATH-500 gold answer written as ``$g$``, ``$$g$$`` and ``\\boxed{g}``, against the bare ``g``."""
    golds = dict.fromkeys(r["answer"] for r in json.loads((data / "math500_test.json").read_text()))
    return [Case(form.format(g), g, 1.0, name) for g in golds for name, form in MATH500_WRITTEN.items()]


LABELLED: dict[str, Callable[[Path], list[Case]]] = {
    "gsm8k gold as model answers": gsm8k_gold_cases,
    "math500 gold as model answers": math500_gold_cases,
    "gsm8k gpt-3 solutions (is_correct)": gpt3_solution_cases,
    "qwen2.5-math math outputs (score)": qwen_math_cases,
}
GOLD_SELF: dict[str, Callable[[Path], list[Case]]] = {
    "verify_cases golds as completions": verify_gold_self_cases,
    "math500 golds as completions": math500_gold_self_cases,
}

_DELIMS = ("$", "\\(", "\\[", "\\boxed", "\\fbox")


def plain_math_verify(cases: list[Case], timeout: int = 5) -> list[float]:
    """math-verify as its README calls it, all defaults: ``verify(parse(gold), parse(completion))``; a bare
    gold (no math delimiters, e.g. MATH-500's ``\\frac{14}{3}``) is written ``$gold$`` first, since math-verify
    only reads LaTeX inside delimiters. In this process (main thread), with math-verify's own signal-based
    timeouts (``timeout`` s per parse and per verify; its default is 5)."""
    import logging

    from math_verify import parse, verify

    logging.getLogger("math_verify").setLevel(logging.ERROR)  # its timeout warnings echo the input
    scores = []
    for case in cases:
        gold = case.gold if any(d in case.gold for d in _DELIMS) else f"${case.gold}$"
        try:
            t = max(1, round(timeout))  # math-verify's alarm takes whole seconds
            gold_parsed, pred_parsed = parse(gold, parsing_timeout=t), parse(case.completion, parsing_timeout=t)
            scores.append(float(verify(gold_parsed, pred_parsed, timeout_seconds=t)))
        except Exception:  # noqa: BLE001 - a failure of the baseline counts as its verdict 0
            scores.append(0.0)
    return scores
