"""math_accuracy inside processes that cannot start the verifier's workers: ``multiprocessing.Pool`` workers
and ``datasets.map(num_proc=2)`` (both daemonic) score in-process, each check under its own time bound, and
give the scores the main process gives.

Run: python -m pytest tests/grpo_core/rewards/test_math_in_workers.py -q
"""

from __future__ import annotations

import multiprocessing as mp
import os
import threading
import time

import pytest

from grpo_core.rewards import math as math_reward, math_accuracy, pop_reward_stats
from grpo_core.rewards.pool import VerifierPool, call_in_process, can_start_workers

TIMEOUT_S = 1.5

# One of each path: fast path, a box, several boxes, an <answer> tag, math-verify on a tail, the last-number
# fallback, a wrong answer, and a row without ground truth.
COMPLETIONS = [
    "so the total is \\boxed{18}",
    "Thus the answer is $\\boxed{\\dfrac{1}{2}}$.",
    "\\boxed{(2, 2)} \\quad \\text{and} \\quad \\boxed{(6, 2)}",
    "<think>...</think><answer>\\frac{\\pi}{2}</answer>",
    "$$f(y) = y$$",
    "The answer is $7.",
    "first \\boxed{5}, on reflection \\boxed{6}",
    "\\boxed{3}",
]
ANSWERS = ["18", "0.5", "(2, 2), (6, 2)", "\\frac{\\pi}{2}", "$$f(y) = y$$", "7", "5", None]
EXPECTED = [1.0, 1.0, 1.0, 1.0, 1.0, 1.0, 0.0, None]
HOSTILE = ["\\boxed{9^{9^{9}}}", "\\boxed{\\frac{2}{4}}"]  # a check that runs past any deadline, then a normal one


@pytest.fixture(scope="module", autouse=True)
def _short_timeout():
    math_reward.configure(timeout=TIMEOUT_S, num_workers=2)
    pop_reward_stats()
    yield
    math_reward.configure(timeout=math_reward.DEFAULT_TIMEOUT_S, num_workers=math_reward.DEFAULT_NUM_WORKERS)


def _score_in_child(_: int) -> dict:
    """Runs in a daemonic pool worker: the reference batch, then a hostile one, timed; never raises."""
    start = time.monotonic()
    try:
        scores = math_accuracy(COMPLETIONS, answer=ANSWERS)
        hostile = math_accuracy(HOSTILE, answer=["3", "0.5"])
    except BaseException as e:  # noqa: BLE001 - reported, so the test names it instead of hanging
        return {"error": repr(e)}
    return {"scores": scores, "hostile": hostile, "hostile_s": time.monotonic() - start,
            "daemon": mp.current_process().daemon, "can_start": can_start_workers(), "pid": os.getpid()}


def test_main_process_scores():
    assert can_start_workers()
    assert math_accuracy(COMPLETIONS, answer=ANSWERS) == EXPECTED


@pytest.mark.parametrize("start_method", ["fork", "forkserver"])
def test_scores_inside_multiprocessing_pool_workers(start_method: str):
    main = math_accuracy(COMPLETIONS, answer=ANSWERS)  # the verifier pool already runs in the parent
    with mp.get_context(start_method).Pool(2) as pool:
        results = pool.map(_score_in_child, range(2))
    for r in results:
        assert "error" not in r, r
        assert r["daemon"] and not r["can_start"]
        assert r["scores"] == main == EXPECTED
        assert r["hostile"] == [0.0, 1.0]
        # bounded by its own alarm: the hang costs one timeout, plus the reference batch and warm-up
        assert r["hostile_s"] < 2 * TIMEOUT_S + 60.0  # unbounded, 9^{9^9} never ends


def test_scores_inside_datasets_map_num_proc_2():
    datasets = pytest.importorskip("datasets")
    main = math_accuracy(COMPLETIONS, answer=ANSWERS)
    ds = datasets.Dataset.from_dict({"completion": COMPLETIONS * 2, "answer": ANSWERS * 2})

    def score(batch: dict) -> dict:
        return {"score": math_accuracy(batch["completion"], answer=batch["answer"]), "pid": [os.getpid()] * len(
            batch["answer"])}

    out = ds.map(score, batched=True, batch_size=len(COMPLETIONS), num_proc=2)
    assert list(out["score"]) == main * 2
    assert len(set(out["pid"])) == 2 and os.getpid() not in set(out["pid"])  # really two other processes


def test_non_daemonic_forked_child_falls_back_when_the_inherited_pool_cannot_start():
    """A plain fork of a process whose verifier runs has the parent's forkserver, which it cannot use."""
    math_accuracy(COMPLETIONS, answer=ANSWERS)
    ctx = mp.get_context("fork")
    with ctx.Manager() as manager:
        box = manager.dict()
        proc = ctx.Process(target=_record_scores, args=(box,))
        proc.start()
        proc.join(120)
        assert proc.exitcode == 0
        assert box["scores"] == EXPECTED, dict(box)


def _record_scores(box) -> None:
    box["scores"] = _score_in_child(0).get("scores")


# -- the in-process bound itself ----------------------------------------------------------------------------


def test_in_process_alarm_bounds_a_slow_check_and_restores_the_callers_timer():
    import signal

    fired = []
    old = signal.signal(signal.SIGALRM, lambda *a: fired.append(1))
    try:
        signal.setitimer(signal.ITIMER_REAL, 3.0)  # the caller's own timer, pending across the check
        start = time.monotonic()
        out = call_in_process(time.sleep, (30,), 0.3)
        assert out.status == "timeout" and time.monotonic() - start < 10  # not the 30 s sleep
        assert call_in_process(pow, (2, 10), 1.0).value == 1024
        assert call_in_process(int, ("x",), 1.0).error == "ValueError"
        assert signal.getsignal(signal.SIGALRM) is not None and 0 < signal.getitimer(signal.ITIMER_REAL)[0] < 3.0
        time.sleep(3.0)
        assert fired == [1]  # the caller's timer still fired, once
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, old)


def test_in_process_watchdog_bounds_a_slow_check_off_the_main_thread():
    got = {}

    def run() -> None:
        start = time.monotonic()
        got["out"] = call_in_process(time.sleep, (30,), 0.3)
        got["elapsed"] = time.monotonic() - start
        got["ok"] = call_in_process(pow, (3, 3), 1.0)

    t = threading.Thread(target=run)
    t.start()
    t.join(60)
    assert got["out"].status == "timeout" and got["elapsed"] < 10  # not the 30 s sleep
    assert got["ok"].value == 27


def _in_daemon(_: int) -> list:
    pool = VerifierPool(time.sleep, num_workers=2, timeout=0.3, memory_limit_mb=None)
    out = pool.map([(0,), (30,), (0,)])
    return [o.status for o in out] + [pool.stats["in_process"]]


def test_pool_map_in_a_daemonic_process_runs_in_process():
    with mp.get_context("fork").Pool(1) as p:
        assert p.map(_in_daemon, [0]) == [["ok", "timeout", "ok", 3]]
