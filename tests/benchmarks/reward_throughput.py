# python tests/benchmarks/reward_throughput.py [--workers 2] [--timeout 3] [--repeat 1] [--limit N] [--quick]
"""Reward throughput: math_accuracy checks per second on GSM8K-style and MATH-style answers.

Answers are the real GSM8K / MATH-500 gold answers (../shared/data), written as a model would: half right
(boxed, some in another spelling such as \\dfrac or 1,000), half wrong (another problem's answer). Rows:
- gsm8k end-to-end: math_accuracy as the trainer calls it (plain numbers take the in-process fast path);
- gsm8k via pool: the same pairs forced through math-verify workers (what a number costs without the fast path);
- math end-to-end: MATH-500 LaTeX answers (most go to math-verify in the workers);
- gsm8k unboxed end-to-end: the GSM8K pairs as "The answer is $1,000." with no box (math-verify's extraction
  reads the tail in the workers before the last number counts).
Prints a table and one JSON line. Not a test: numbers depend on the machine and its load. ``--quick``: the first
100 answers of each set (``--limit 100``), in seconds; ``tests/benchmarks/test_benchmark_scripts.py`` runs it and
checks each row's keys and that about half of each set scores 1 (half the answers are right by construction).
"""

from __future__ import annotations

import argparse
import json
import os
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
DATA = Path(os.environ.get("R1_SHARED_DATA", ROOT.parent / "shared" / "data"))


def gsm8k_cases(limit: int | None = None) -> tuple[list[str], list[str]]:
    rows = [json.loads(line) for line in (DATA / "gsm8k_test.jsonl").open()][:limit]
    golds = [r["answer"].rsplit("####", 1)[1].strip().replace(",", "") for r in rows]
    completions = []
    for i, gold in enumerate(golds):
        shown = f"{int(gold):,}" if gold.isdigit() else gold
        pred = shown if i % 2 == 0 else golds[(i + 1) % len(golds)]
        completions.append(f"Step 1: 3 + 4 = 7. Step 2: more work.\nThe answer is \\boxed{{{pred}}}.")
    return completions, golds


def unboxed(completions: list[str]) -> list[str]:
    return [c.replace("\\boxed{", "$").replace("}.", ".") for c in completions]


def math_cases(limit: int | None = None) -> tuple[list[str], list[str]]:
    golds = [r["answer"] for r in json.loads((DATA / "math500_test.json").read_text())][:limit]
    completions = []
    for i, gold in enumerate(golds):
        pred = gold.replace("\\frac", "\\dfrac") if i % 2 == 0 else golds[(i + 1) % len(golds)]
        completions.append(f"Working through the algebra...\nThus the answer is $\\boxed{{{pred}}}$.")
    return completions, golds


def measure(name: str, fn, n: int, repeat: int) -> dict:
    start = time.perf_counter()
    for _ in range(repeat):
        scores = fn()
    wall = time.perf_counter() - start
    return {"name": name, "checks": n * repeat, "wall_s": round(wall, 3), "checks_per_s": round(n * repeat / wall, 1),
            "mean_reward": round(sum(s or 0.0 for s in scores) / n, 3)}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--timeout", type=float, default=3.0)
    ap.add_argument("--repeat", type=int, default=1)
    ap.add_argument("--limit", type=int, default=None, help="the first N answers of each set (default: all)")
    ap.add_argument("--quick", action="store_true", help="--limit 100 (a smoke run)")
    args = ap.parse_args()
    if args.quick:
        args.limit = args.limit or 100

    from grpo_core.rewards import math as math_reward
    from grpo_core.rewards import math_accuracy, pop_reward_stats
    from grpo_core.rewards.extract import extract_answer
    from grpo_core.rewards.math import VerifyOptions

    math_reward.configure(timeout=args.timeout, num_workers=args.workers)
    math_accuracy(["\\boxed{\\frac{1}{2}}"], answer=["0.5"])  # start the workers outside the timings
    pop_reward_stats()

    g_comp, g_gold = gsm8k_cases(args.limit)
    m_comp, m_gold = math_cases(args.limit)
    g_jobs = [("answer", g, extract_answer(c).text, "boxed", VerifyOptions()) for c, g in zip(g_comp, g_gold)]
    pool = math_reward.get_pool()

    rows = [
        measure("gsm8k end-to-end", lambda: math_accuracy(g_comp, answer=g_gold), len(g_comp), args.repeat),
        measure("gsm8k via pool (no fast path)", lambda: [o.value for o in pool.map(g_jobs)], len(g_jobs),
                args.repeat),
        measure("math end-to-end", lambda: math_accuracy(m_comp, answer=m_gold), len(m_comp), args.repeat),
        measure("gsm8k unboxed end-to-end", lambda: math_accuracy(unboxed(g_comp), answer=g_gold), len(g_comp),
                args.repeat),
    ]
    stats = pop_reward_stats()
    print(f"workers={args.workers} timeout={args.timeout}s cpu_count={os.cpu_count()} "
          f"load_avg_1min={os.getloadavg()[0]:.2f}")
    print(f"{'benchmark':<32} {'checks':>7} {'wall s':>8} {'checks/s':>10} {'mean reward':>12}")
    for r in rows:
        print(f"{r['name']:<32} {r['checks']:>7} {r['wall_s']:>8.2f} {r['checks_per_s']:>10.1f} {r['mean_reward']:>12.3f}")
    print(json.dumps({"benchmark": "reward_throughput", "workers": args.workers, "timeout_s": args.timeout,
                      "rows": rows, "reward_events": stats}))


if __name__ == "__main__":
    main()
