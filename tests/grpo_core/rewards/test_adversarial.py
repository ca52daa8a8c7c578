"""Untrusted completions never crash or stall the reward: each call returns within a few timeouts.

The bounds tell a call bounded by its timeout from one that is not (those run for minutes, hours or forever);
they leave room for a busy 2-core machine, several times slower than a quiet one.

Run: python -m pytest tests/grpo_core/rewards/test_adversarial.py -q
"""

from __future__ import annotations

import os
import time

import pytest

from grpo_core.rewards import math as math_reward, math_accuracy, pop_reward_stats
from grpo_core.rewards.extract import extract_answer, find_last_boxed
from grpo_core.rewards.pool import VerifierPool

TIMEOUT_S = 1.5
BOUND_S = 4 * TIMEOUT_S + 2.0


@pytest.fixture(scope="module", autouse=True)
def _fast_timeout():
    math_reward.configure(timeout=TIMEOUT_S, num_workers=2)
    math_accuracy(["\\boxed{\\frac{1}{2}}"], answer=["0.5"])  # warm the workers outside the timed calls
    pop_reward_stats()
    yield
    math_reward.configure(timeout=math_reward.DEFAULT_TIMEOUT_S, num_workers=math_reward.DEFAULT_NUM_WORKERS)


def timed_score(completion, gold: str = "5") -> tuple[float | None, float]:
    start = time.monotonic()
    [score] = math_accuracy([completion], answer=[gold])
    return score, time.monotonic() - start


def assert_pool_usable() -> None:
    assert math_accuracy(["so \\boxed{\\frac{1}{2}}", "\\boxed{3}"], answer=["0.5", "4"]) == [1.0, 0.0]


ADVERSARIAL = {
    "braces nested 5,000 deep": "\\boxed{" + "{" * 5000 + "5" + "}" * 5000 + "}",
    "braces nested 1,900 deep (fits the tail)": "\\boxed{" + "{" * 1900 + "5" + "}" * 1900 + "}",
    "9^{9^9}": "The answer is \\boxed{9^{9^{9}}}",
    "1000000!": "\\boxed{1000000!}",
    "huge exponent": "\\boxed{2^{10^{12}}-10^{10^{10}}}",
    "tower of factorials": "\\boxed{((((10!)!)!)!)}",
    "10 MB string": "x" * (10 * 2**20) + " \\boxed{5}",
    "10 MB of braces": "{" * (10 * 2**20),
    "invalid UTF-8 bytes": b"\xff\xfe\xc3\x28 \\boxed{5} \xed\xa0\x80",
    "lone surrogates": "\ud800 \\boxed{5} \udfff",
    "unclosed box": "so the answer is \\boxed{\\frac{1}{2",
    "right box then wrong box": "first \\boxed{5}, on reflection \\boxed{6}",
    "NUL and control chars": "\x00\x01\x1b[31m\\boxed{5}\x00",
    "deep LaTeX fractions": "\\boxed{" + "\\frac{1}{" * 600 + "2" + "}" * 600 + "}",
}
EXPECTED = {"10 MB string": 1.0, "invalid UTF-8 bytes": 1.0, "lone surrogates": 1.0,
            "NUL and control chars": 1.0, "right box then wrong box": 0.0, "9^{9^9}": 0.0, "1000000!": 0.0}


@pytest.mark.parametrize("name", list(ADVERSARIAL))
def test_adversarial_completion_is_bounded(name: str):
    score, elapsed = timed_score(ADVERSARIAL[name])
    assert score in (0.0, 1.0)
    assert elapsed < BOUND_S, f"{name}: {elapsed:.2f}s > {BOUND_S}s"
    if name in EXPECTED:
        assert score == EXPECTED[name]
    assert_pool_usable()


def test_timeout_is_counted_and_pool_recovers():
    pop_reward_stats()
    scores = math_accuracy(["\\boxed{9^{9^{9}}}", "\\boxed{\\frac{1}{2}}"], answer=["3", "0.5"])
    assert scores == [0.0, 1.0]
    assert pop_reward_stats().get("rewards/math_accuracy/timeouts", 0) >= 1
    assert_pool_usable()


def test_batch_of_hostile_items_is_bounded_by_items_over_workers():
    completions = ["\\boxed{9^{9^{9}}}"] * 4 + ["\\boxed{\\frac{2}{4}}"] * 4
    start = time.monotonic()
    scores = math_accuracy(completions, answer=["0.5"] * 8)
    elapsed = time.monotonic() - start
    assert scores == [0.0] * 4 + [1.0] * 4
    # 4 hangs over 2 workers: two rounds of one timeout each; respawned workers warm up (~0.4 s, off the clock)
    assert elapsed < (4 / 2) * BOUND_S + 2.0


def test_extraction_is_linear_on_pathological_text():
    start = time.monotonic()
    assert find_last_boxed("\\boxed{" * 50_000) is None
    assert extract_answer("\\boxed{" * 2_000_000 + "7") .text == "7"  # tail-clipped, then the last number
    assert time.monotonic() - start < 30  # linear: ~0.3 s; a quadratic scan of 14M characters takes hours


# -- the pool itself, with stdlib functions as checks ----------------------------------------------------


def test_pool_kills_a_check_stuck_in_c_code_and_replaces_the_worker():
    pool = VerifierPool(pow, num_workers=2, timeout=1.0, memory_limit_mb=None)
    try:
        assert [o.value for o in pool.map([(2, 10), (3, 3)])] == [1024, 27]
        start = time.monotonic()
        out = pool.map([(9, 9**9), (2, 5)])  # 9^387420489 runs in GMP and ignores signals
        assert time.monotonic() - start < 10  # the check alone runs for minutes
        assert [o.status for o in out] == ["timeout", "ok"] and out[1].value == 32
        assert pool.stats["timeouts"] == 1 and pool.stats["restarts"] >= 1
        assert [o.value for o in pool.map([(2, 3)] * 4)] == [8] * 4
    finally:
        pool.close()
    assert all(not w.proc.is_alive() for w in pool._workers)


def test_pool_survives_a_worker_that_dies_and_one_that_sleeps():
    pool = VerifierPool(os._exit, num_workers=1, timeout=1.0, memory_limit_mb=None)
    try:
        out = pool.map([(3,), (4,)])
        assert [o.status for o in out] == ["error", "error"] and out[0].error == "WorkerDied"
    finally:
        pool.close()
    sleeper = VerifierPool(time.sleep, num_workers=2, timeout=0.5, memory_limit_mb=None)
    try:
        start = time.monotonic()
        out = sleeper.map([(30,), (0,), (30,), (0,)])
        assert [o.status for o in out] == ["timeout", "ok", "timeout", "ok"]
        assert time.monotonic() - start < 15  # two rounds of 0.5 s; unbounded, one sleep is 30 s
    finally:
        sleeper.close()
