# python tests/benchmarks/verify_agreement.py [--timeout 5] [--sets verify,golds,labelled] [--misses 0] [--limit N] [--quick]
"""Agreement with the labels: ``math_accuracy`` (default options, as users call it) beside plain math-verify.

Data sets (../shared/data, built by tests/grpo_core/rewards/labelled_cases.py):
- ``verify_cases``: Math-Verify's own test cases (pred, gold, expected), each case's options ignored;
- gold-as-completion sets: every verify_cases gold (as written) and every MATH-500 gold (as ``$g$``,
  ``$$g$$``, ``\\boxed{g}``) scored against itself (label 1);
- labelled sets: GSM8K / MATH-500 gold answers written as model answers, GPT-3 GSM8K solutions
  (``is_correct``), Qwen2.5-Math outputs (Qwen's grader's ``score``).
Plain math-verify is ``verify(parse(gold), parse(completion))`` with every default, in this process (a bare
gold is written ``$gold$`` first). Both get the same per-check time limit (``--timeout``, math-verify's default
5 s), so the comparison measures extraction, not this machine's load. Prints one JSON line per data set.
Not a test (tests/grpo_core/rewards/test_math_accuracy.py asserts the bounds). ``--quick``: the first 40 cases of
each data set (``--limit 40``); ``tests/benchmarks/test_benchmark_scripts.py`` runs it and checks each line's keys
and counts.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
DATA = Path(os.environ.get("R1_SHARED_DATA", ROOT.parent / "shared" / "data"))
sys.path.insert(0, str(ROOT / "tests" / "grpo_core" / "rewards"))


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--timeout", type=float, default=5.0,
                    help="seconds per check, for both (math-verify's default)")
    ap.add_argument("--sets", default="verify,golds,labelled", help="comma list of: verify, golds, labelled")
    ap.add_argument("--misses", type=int, default=0, help="also print up to N disagreements per data set")
    ap.add_argument("--limit", type=int, default=None, help="the first N cases of each data set (default: all)")
    ap.add_argument("--quick", action="store_true", help="--limit 40 (a smoke run)")
    args = ap.parse_args()
    if args.quick:
        args.limit = args.limit or 40

    import labelled_cases as lc

    from grpo_core.rewards import math as math_reward
    from grpo_core.rewards import math_accuracy, pop_reward_stats

    math_reward.configure(timeout=args.timeout)
    groups = {"verify": {"verify_cases (no per-case options)": lc.verify_cases}, "golds": lc.GOLD_SELF,
              "labelled": lc.LABELLED}
    for group in args.sets.split(","):
        for name, build in groups[group].items():
            cases = build(DATA)[: args.limit]
            start = time.perf_counter()
            ours = math_accuracy([c.completion for c in cases], answer=[c.gold for c in cases])
            ours_s = time.perf_counter() - start
            start = time.perf_counter()
            plain = lc.plain_math_verify(cases, timeout=args.timeout)
            plain_s = time.perf_counter() - start
            n = len(cases)
            agree = sum(s == c.label for s, c in zip(ours, cases))
            plain_agree = sum(s == c.label for s, c in zip(plain, cases))
            print(json.dumps({"data_set": name, "cases": n, "ours": round(agree / n, 4),
                              "math_verify": round(plain_agree / n, 4), "ours_n": agree,
                              "math_verify_n": plain_agree,
                              "ours_s": round(ours_s, 1), "math_verify_s": round(plain_s, 1),
                              "reward_events": pop_reward_stats()}), flush=True)
            shown = 0
            for s, p, c in zip(ours, plain, cases):
                if s != c.label and shown < args.misses:
                    shown += 1
                    print(f"  miss: gold={c.gold[:60]!r} label={c.label} ours={s} math_verify={p} "
                          f"tail={c.completion[-100:]!r}")


if __name__ == "__main__":
    main()
