"""Small files in the schema of open-r1/OpenR1-Math-220k (its dataset card's features), made on demand.

    python tests/grpo_core/trace_fixtures.py /tmp/openr1.jsonl

Each problem has generations ``<think>\\n...\\n</think>\\n\\nsummary \\boxed{}`` as R1 wrote them, with
``correctness_math_verify`` verdicts; some generations are the kinds the filters must drop.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

CLEAN = "<think>\nWe add {a} and {b}.\n\nThat gives {c}. Let me check: {c} - {b} = {a}. Yes.\n</think>\n\nThe sum is $\\boxed{{{c}}}$."
WRONG = "<think>\nWe add {a} and {b}, which is {w}.\n</think>\n\nThe sum is $\\boxed{{{w}}}$."
CODE = "<think>\nLet me compute it:\n```python\nprint({a} + {b})\n```\nIt prints {c}.\n</think>\n\n$\\boxed{{{c}}}$"
TRUNCATED = "<think>\nWe add {a} and {b}. Hmm, wait, let me reconsider the carry"
MIXED = "<think>\nWe add {a} and {b}. 我们把两个数相加，得到的结果是{c}，这个答案是正确的。\n</think>\n\n$\\boxed{{{c}}}$"
SECOND = "<think>\nCount up {b} from {a}: the result is {c}.\n</think>\n\nSo the answer is $\\boxed{{{c}}}$."

# per problem: (template, correct)
PATTERNS = [
    [(CLEAN, True), (WRONG, False)],
    [(CODE, True), (CLEAN, True), (SECOND, True)],  # k=1 keeps CLEAN; SECOND is over the limit
    [(TRUNCATED, False), (TRUNCATED, True), (MIXED, True)],  # nothing readable
    [(CLEAN, True), (CLEAN, True)],  # a repeat
]


def openr1_rows(num_problems: int = 8) -> list[dict[str, Any]]:
    rows = []
    for i in range(num_problems):
        a, b = 10 + i, 20 + 3 * i
        fill = {"a": a, "b": b, "c": a + b, "w": a + b + 1}
        gens = [(t.format(**fill), ok) for t, ok in PATTERNS[i % len(PATTERNS)]]
        problem = f"What is {a} + {b}?"
        rows.append({
            "problem": problem, "solution": f"{a} + {b} = {a + b}", "answer": str(a + b),
            "problem_type": "Algebra", "question_type": "math-word-problem", "source": "fixture",
            "uuid": f"fixture-{i:04d}",
            "is_reasoning_complete": ["</think>" in g for g, _ in gens],
            "generations": [g for g, _ in gens],
            "correctness_math_verify": [ok for _, ok in gens],
            "correctness_llama": None,
            "finish_reasons": ["stop" if "</think>" in g else "length" for g, _ in gens],
            "correctness_count": sum(ok for _, ok in gens),
            "messages": [{"role": "user", "content": problem}, {"role": "assistant", "content": gens[0][0]}],
        })
    return rows


def write_openr1(path: str | Path, num_problems: int = 8) -> Path:
    """jsonl, or parquet when ``path`` ends in ``.parquet``."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    rows = openr1_rows(num_problems)
    if path.suffix == ".parquet":
        import pyarrow as pa
        import pyarrow.parquet as pq

        pq.write_table(pa.Table.from_pylist(rows), path)
    else:
        path.write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows), encoding="utf-8")
    return path


if __name__ == "__main__":
    print(write_openr1(sys.argv[1]))
