"""The emergence features on hand-written responses (English and Chinese), the phase rule and the aha rule."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest

from grpo_core.config import BACKTRACK_PHRASES, REFLECTION_PHRASES, EmergenceConfig, EvalConfig, GRPOConfig
from grpo_core.evaluation.emergence import (
    AHA_DEFAULT_COUNT,
    AHA_MIN_RISE,
    AHA_WINDOW,
    PHASES,
    aha_verdict,
    count_steps,
    emergence_metrics,
    find_aha_step,
    has_phrase,
    phase_label,
    reasoning_text,
    response_features,
    rise_threshold,
)
from grpo_core.generation import Rollout
from grpo_core.trainer.metrics import completion_metrics

R1_STYLE = ("<think>\nThe area is 3*4 = 12.\nWait, let me check: 3*4 is 12, yes.\nSo the answer is 12.\n</think>\n"
            "<answer>12</answer>")
BACKTRACKING = ("<think>x = 5 - 2 = 4. Actually, that's wrong: 5 - 2 = 3. Let me verify: 3 + 2 = 5.</think>"
                "<answer>3</answer>")
CHINESE = "<think>先算 3×4=12。等等，验证一下：12÷4=3，对。</think><answer>12</answer>"
CHINESE_BACKTRACK = "<think>2+2=5。不对，应该是 2+2=4。</think><answer>4</answer>"
CHAIN = "<think>7+8=15;15*3=45;45-5=40</think><answer>40</answer>"
DIRECT = "<think></think><answer>40</answer>"


def test_reasoning_is_the_think_block_or_the_text_without_answers():
    assert reasoning_text(CHAIN) == "7+8=15;15*3=45;45-5=40"
    assert reasoning_text("<think>still going, wait") == "still going, wait"
    assert reasoning_text("First 2+2=4. <answer>4</answer>").strip() == "First 2+2=4."
    assert reasoning_text(DIRECT) == ""


def test_steps_split_at_lines_semicolons_and_sentence_ends():
    assert count_steps("7+8=15;15*3=45;45-5=40") == 3
    assert count_steps("") == 0 and count_steps(" \n ; . ") == 0
    assert count_steps("Half of 7 is 3.5 here. Then add 1!\nDone") == 3  # 3.5 is not a sentence end
    assert count_steps("先算 3×4=12。再除以 4；得 3") == 3
    assert response_features(R1_STYLE).steps == 3


@pytest.mark.parametrize("text, expected", [
    ("Wait, let me reconsider.", True),
    ("WAIT.", True),
    ("let   me\ncheck that", True),  # spaces in a phrase match any whitespace
    ("I double-check the sum.", True),
    ("Hmm, 等等，这里不对。", True),
    ("现在验证结果", True),  # Chinese phrases match inside a run of characters
    ("The awaited result is 4.", False),  # 'wait' inside another word does not count
    ("We waited for it; awaiting input; a waiter", False),
    ("The answer is verified as 4.", False),  # 'verify' is a word; 'verified' is another
    ("检测结果", False),
])
def test_reflection_phrases_match_whole_words_and_chinese_anywhere(text, expected):
    assert has_phrase(text, REFLECTION_PHRASES) is expected


def test_backtracking_phrases_with_apostrophes_either_way():
    assert has_phrase("That's wrong, so", BACKTRACK_PHRASES)
    assert has_phrase("That\u2019s wrong, so", BACKTRACK_PHRASES)  # a curly apostrophe as typed by models
    assert has_phrase("Actually 3.", BACKTRACK_PHRASES) and not has_phrase("factually 3", BACKTRACK_PHRASES)
    assert has_phrase("不对，重来", BACKTRACK_PHRASES)
    assert not has_phrase("anything", []) and not has_phrase("anything", ["  "])


def test_response_features_by_hand():
    f = response_features(BACKTRACKING)
    assert (f.direct, f.steps, f.reflection, f.backtrack) == (False, 3, True, True)
    f = response_features(CHINESE)
    assert (f.direct, f.steps, f.reflection, f.backtrack) == (False, 2, True, False)
    assert response_features(CHINESE_BACKTRACK).backtrack and not response_features(CHINESE_BACKTRACK).reflection
    f = response_features(DIRECT)
    assert (f.direct, f.steps, f.reflection, f.backtrack) == (True, 0, False, False)
    # a phrase in the answer block is not reasoning
    assert not response_features("<think>1+1=2</think><answer>wait</answer>").reflection


def test_emergence_metrics_by_hand():
    texts = [R1_STYLE, BACKTRACKING, CHINESE, CHAIN, DIRECT]
    correct = [True, False, True, True, False]
    m = emergence_metrics(texts, correct=correct, lengths=[30, 20, 10, 8, 2])
    assert m["direct_rate"] == pytest.approx(1 / 5)
    assert m["mean_steps"] == pytest.approx((3 + 3 + 2 + 3 + 0) / 5)
    assert m["reflection_rate"] == pytest.approx(3 / 5)
    assert m["backtrack_rate"] == pytest.approx(1 / 5)
    assert m["mean_length"] == pytest.approx(70 / 5)
    assert m["accuracy_with_reflection"] == pytest.approx(2 / 3)  # R1_STYLE, BACKTRACKING, CHINESE
    assert m["accuracy_without_reflection"] == pytest.approx(1 / 2)  # CHAIN, DIRECT
    assert emergence_metrics([CHAIN])["mean_length"] == len(CHAIN)  # characters without token counts
    assert "accuracy_with_reflection" not in emergence_metrics([CHAIN])
    none = emergence_metrics([CHAIN, DIRECT], correct=[True, False])
    assert math.isnan(none["accuracy_with_reflection"]) and none["accuracy_without_reflection"] == 0.5
    assert math.isnan(emergence_metrics([])["reflection_rate"])
    with pytest.raises(ValueError, match="2 texts but 1 correct"):
        emergence_metrics([CHAIN, DIRECT], correct=[True])


def test_phrase_lists_are_configurable():
    custom = emergence_metrics([CHAIN, "<think>hmm 1+1=2</think>"], reflection_phrases=["hmm"], backtrack_phrases=[])
    assert custom["reflection_rate"] == 0.5 and custom["backtrack_rate"] == 0.0
    cfg = EmergenceConfig(reflection_phrases=["hmm"])
    assert cfg.backtrack_phrases == list(BACKTRACK_PHRASES)
    assert GRPOConfig().emergence.reflection_phrases == list(REFLECTION_PHRASES)
    assert EvalConfig(emergence={"reflection_phrases": ["hmm"]}).emergence.reflection_phrases == ["hmm"]
    assert "等等" in REFLECTION_PHRASES and "wait" in REFLECTION_PHRASES and "不对" in BACKTRACK_PHRASES


def test_phase_rule():
    assert phase_label(0.9, 0.2, 0.0, 0.0) == PHASES[0]
    assert phase_label(0.0, 1.5, 0.0, 0.0) == PHASES[0]  # under two steps on average is little reasoning
    assert phase_label(0.0, 2.0, 0.0, 0.0) == PHASES[1]
    assert phase_label(0.0, 3.0, 0.05, 0.0) == PHASES[1]
    assert phase_label(0.0, 6.0, 0.4, 0.01) == PHASES[2]
    assert phase_label(0.0, 9.0, 0.4, 0.2) == PHASES[3]
    assert phase_label(0.5, 9.0, 0.4, 0.2) == PHASES[0]  # the first rule that holds wins


def test_aha_rule_marks_the_step_a_lasting_rise_begins():
    steps = list(range(1, 61))
    jump = [0.02 if s < 30 else 0.6 for s in steps]
    assert find_aha_step(steps, jump) == 30
    assert find_aha_step(steps[::-1], jump[::-1]) == 30  # order of the history does not matter
    assert find_aha_step(steps, jump, [64] * 60) == 30  # counts given: the same clear jump
    assert find_aha_step(steps, [0.3] * 60) is None  # flat
    noisy_flat = [0.3 + (0.04 if s % 2 else -0.04) for s in steps]
    assert find_aha_step(steps, noisy_flat) is None
    spike = [0.0] * 60
    spike[20:23] = [0.4] * 3  # three steps: windows above the start, but neither persisting nor at the end
    assert find_aha_step(steps, spike) is None
    assert find_aha_step(steps, [0.5 if s < 30 else 0.1 for s in steps]) is None  # a fall is no aha
    # a dip, then a rise above the start: found where the rise began; the baseline is the start
    dip = [0.3 if s < 15 else 0.05 if s < 40 else 0.5 for s in steps]
    assert find_aha_step(steps, dip) == 40
    assert find_aha_step(steps, [0.3 if s < 15 or s >= 40 else 0.05 for s in steps]) is None  # back to the start
    late = [0.3 if s < 15 else 0.05 if s < 40 else 0.34 for s in steps]  # above the start, by less than 5 points
    assert find_aha_step(steps, late, [10_000] * 60) is None
    assert find_aha_step(steps, jump, window=1, min_rise=0.5) == 30
    assert find_aha_step(steps, jump, min_rise=0.6) is None
    assert find_aha_step(steps[:24], jump[:24]) is None  # fewer steps than baseline + window + persistence
    assert find_aha_step(steps, [math.nan] * 29 + jump[29:]) is None  # unlogged steps are skipped
    with pytest.raises(ValueError, match="window"):
        find_aha_step(steps, jump, window=0)


def test_aha_threshold_scales_with_the_completions_counted():
    """The same 0.2 -> 0.3 rise is an aha over 128 completions a step and noise over 8; a missing count is
    AHA_DEFAULT_COUNT."""
    steps = list(range(1, 61))
    rise = [0.2 if s < 30 else 0.3 for s in steps]
    assert find_aha_step(steps, rise, [128] * 60) == 30
    assert find_aha_step(steps, rise, [8] * 60) is None
    assert find_aha_step(steps, rise, [None] * 60) == find_aha_step(steps, rise, [AHA_DEFAULT_COUNT] * 60)
    assert rise_threshold(0.5, 640, 0.5, 320) == pytest.approx(3 * math.sqrt(0.25 * (1 / 640 + 1 / 320)))
    assert rise_threshold(0.5, 1e9, 0.5, 1e9) == AHA_MIN_RISE  # a huge count: the minimum rise holds


def test_aha_verdict_gives_the_accuracy_change_over_the_rise():
    steps = list(range(1, 61))
    refl = [0.02 if s < 30 else 0.6 for s in steps]
    accuracy = [0.2 if s < 32 else 0.7 for s in steps]
    v = aha_verdict(steps, refl, accuracy=accuracy)
    assert v.step == 30 and v.baseline == (1, 10) and v.p0 == pytest.approx(0.02)
    assert v.rise == (30, 40)  # the window 26-30 already detects the jump; the last persistence window ends at 40
    assert v.accuracy_change == pytest.approx((2 * 0.2 + 9 * 0.7) / 11 - 0.2)
    assert aha_verdict(steps, refl).accuracy_change is None
    assert aha_verdict(steps, [0.3] * 60, accuracy=accuracy).step is None


STEPS = 500
RUNS = 200


def _simulated(rng: np.random.Generator, rates: np.ndarray, count: int) -> list[list[float]]:
    """RUNS binomial curves: at each step ``count`` completions, each with the feature at that step's rate."""
    return (rng.binomial(count, np.clip(rates, 0.0, 1.0), size=(RUNS, len(rates))) / count).tolist()


@pytest.mark.parametrize("shape", ["flat", "dip and recover"])
def test_aha_false_positive_rate_on_curves_without_a_rise(shape):
    """No aha in more than 5% of simulated runs of 500 steps without a rise: flat, or a dip of 0.15 for 80 steps
    that recovers to the start. The old rule (5-step mean 0.1 above the lowest earlier one) named one in
    26-100% of flat runs at 48-64 completions and in every dip-and-recover run."""
    rng = np.random.default_rng(0 if shape == "flat" else 1)
    steps = list(range(1, STEPS + 1))
    for count in (48, 64, 128):
        for rate in (0.1, 0.2, 0.3, 0.5):
            rates = np.full(STEPS, rate)
            if shape != "flat":
                rates[200:280] -= 0.15
            found = sum(find_aha_step(steps, run, [count] * STEPS) is not None for run in _simulated(rng, rates, count))
            assert found / RUNS <= 0.05, (shape, count, rate, found)


@pytest.mark.parametrize(("low", "high", "length", "count", "latest"),
                         [(0.05, 0.5, 30, 14 * 8, 15), (0.1, 0.4, 50, 64, 25)])
def test_aha_power_on_a_real_rise(low, high, length, count, latest):
    """A rise from ``low`` to ``high`` over ``length`` steps from step 200 is found in >= 95% of runs, marked
    at most one window before the rise began and no later than ``latest`` steps into it."""
    rng = np.random.default_rng(2)
    steps = np.arange(1, STEPS + 1)
    rates = low + (high - low) * np.clip((steps - 199) / length, 0.0, 1.0)
    marked = [find_aha_step(steps.tolist(), run, [count] * STEPS) for run in _simulated(rng, rates, count)]
    near = [m for m in marked if m is not None and 200 - AHA_WINDOW <= m <= 200 + latest]
    assert len(near) / RUNS >= 0.95, sorted(m - 200 for m in marked if m is not None)


def test_grpo_step_metrics_carry_the_features():
    rollouts = [Rollout([1], [5] * n, None, False, text) for n, text in ((12, R1_STYLE), (9, CHAIN), (3, DIRECT))]
    m = completion_metrics(rollouts)
    assert m["completions/reflection_rate"] == pytest.approx(1 / 3)
    assert m["completions/mean_steps"] == pytest.approx((3 + 3 + 0) / 3)
    assert m["completions/direct_rate"] == pytest.approx(1 / 3) and m["completions/backtrack_rate"] == 0.0
    assert m["completions/mean_length"] == pytest.approx(8.0)  # tokens, as before
    assert completion_metrics(rollouts, ["7+8"], [])["completions/reflection_rate"] == pytest.approx(1 / 3)


QWEN_OUTPUTS = Path(__file__).resolve().parents[3] / "shared" / "data" / "qwen25math_math_cot_100_outputs.jsonl"


def test_real_sampled_solutions():
    """Qwen2.5-Math's sampled CoT on MATH (8 per problem, graded by Qwen's own grader): a real self-correction is
    found, and the accuracy split by reflection adds back up to the overall accuracy."""
    if not QWEN_OUTPUTS.exists():
        pytest.skip(f"{QWEN_OUTPUTS} not found (real data lives in ../shared/data, see its PROVENANCE.md)")
    texts, correct = [], []
    for line in QWEN_OUTPUTS.read_text().splitlines():
        row = json.loads(line)
        texts += row["code"]
        correct += [bool(s) for s in row["score"]]
    corrected = next(t for t in texts if "This is incorrect; let's re-evaluate the division" in t)
    f = response_features(corrected)
    assert f.reflection and f.backtrack and not f.direct and f.steps > 5
    m = emergence_metrics(texts, correct=correct)
    with_r = round(m["reflection_rate"] * len(texts))
    total = m["accuracy_with_reflection"] * with_r + m["accuracy_without_reflection"] * (len(texts) - with_r)
    assert total == pytest.approx(sum(correct))
    assert 0 < with_r < len(texts) and m["direct_rate"] == 0.0  # no think tags: all reasoning, never direct
