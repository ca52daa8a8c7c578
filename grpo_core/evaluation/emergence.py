"""The seed's emergence features, measured on sampled completions; its phase labels and "aha" step by rule.

The seed describes each phase of R1 training by how responses look: direct answers with little reasoning;
simple calculation steps; step-by-step reasoning with self-checking; structured reasoning with backtracking
and verification; and the "aha moment" ("Wait, let me reconsider...") after which accuracy jumps. This module
turns those words into numbers. Everything here is a pure function of the completion texts.

Per response:

- **reasoning**: the text inside the first ``<think>...</think>`` (everything after ``<think>`` when it is
  never closed); a completion without ``<think>`` is all reasoning, less its ``<answer>...</answer>`` blocks.
- **direct**: ``evaluation.is_direct``: the completion opens with an empty ``<think></think>``.
- **steps**: the reasoning split at line breaks, ``;``, and sentence ends (``.``, ``!``, ``?`` followed by
  whitespace or the end, so ``3.5`` stays whole; Chinese ``。！？；``); the non-empty pieces holding a letter or
  digit are counted. ``7+8=15;15*3=45;45-5=40`` is 3 steps, an empty think block 0.
- **reflection** / **backtracking**: the reasoning contains a phrase of ``reflection_phrases`` /
  ``backtrack_phrases``, case-insensitive. A phrase holding a CJK character matches anywhere (Chinese has no
  word boundaries); any other phrase matches only as whole words (``wait`` is not found in ``awaited``), its
  spaces matching any whitespace; curly apostrophes count as ``'``.

Over a set of responses (``emergence_metrics``): ``direct_rate``, ``mean_steps``, ``reflection_rate``,
``backtrack_rate``, ``mean_length`` (tokens when given, else characters) and, when correctness is given,
``accuracy_with_reflection`` / ``accuracy_without_reflection`` (NaN where the group is empty).

Departure from the seed: its phases are described, not defined; ``phase_label`` and ``find_aha_step`` state
the thresholds used (module constants below), so a report's labels can be checked against its numbers.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from functools import lru_cache
from typing import Sequence

from grpo_core.config import BACKTRACK_PHRASES, REFLECTION_PHRASES

# phase_label's thresholds (shares of responses, steps per response).
DIRECT_PHASE_MIN_DIRECT_RATE = 0.5
LITTLE_REASONING_MAX_STEPS = 2.0  # below: one piece of reasoning or none
SELF_CHECK_MIN_REFLECTION_RATE = 0.1
BACKTRACK_MIN_RATE = 0.05
PHASES = ("direct answers with little reasoning", "simple calculation steps",
          "step-by-step with self-checking", "structured reasoning with backtracking and verification")

# find_aha_step's defaults (the rule is in its docstring). Steps are logged steps; a rate is a share of completions.
AHA_BASELINE = 10  # the first steps: the starting level p0; the last as many: where the curve ends
AHA_WINDOW = 5  # the rolling window compared with p0
AHA_Z = 3.0  # one-sided z on the binomial standard error of (window rate - p0)
AHA_MIN_RISE = 0.05  # and at least this much above p0 (absolute), however many completions
AHA_PERSIST = 10  # windows after the detecting one that must all stay above the start too
AHA_DEFAULT_COUNT = 32  # completions a rate is taken to be over when no count is logged (few: a wide threshold)

_DIRECT = re.compile(r"^\s*<think>\s*</think>")  # evaluation.is_direct is this function
_ANSWER = re.compile(r"<answer>.*?</answer>", re.S)
_STEP_SPLIT = re.compile(r"[\n;；。！？]|[.!?](?=\s|$)")
_WORDLIKE = re.compile(r"\w")
_CJK = re.compile(r"[\u3000-\u303f\u3400-\u4dbf\u4e00-\u9fff\uf900-\ufaff\uff00-\uffef]")


def is_direct(text: str) -> bool:
    return bool(_DIRECT.match(text))


def reasoning_text(text: str) -> str:
    """The reasoning part of a completion (see the module docstring)."""
    start = text.find("<think>")
    if start < 0:
        return _ANSWER.sub(" ", text)
    start += len("<think>")
    end = text.find("</think>", start)
    return text[start:] if end < 0 else text[start:end]


def count_steps(reasoning: str) -> int:
    """Non-empty pieces of ``reasoning`` between line breaks, ``;`` and sentence ends."""
    return sum(1 for piece in _STEP_SPLIT.split(reasoning) if _WORDLIKE.search(piece))


@lru_cache(maxsize=64)
def compile_phrases(phrases: tuple[str, ...]) -> re.Pattern[str] | None:
    """One case-insensitive pattern for ``phrases``: whole words, except phrases with CJK characters."""
    parts = []
    for phrase in phrases:
        words = phrase.strip().lower().replace("\u2019", "'").split()
        if not words:
            continue
        body = r"\s+".join(re.escape(w) for w in words)
        parts.append(body if _CJK.search(phrase) else rf"(?<!\w){body}(?!\w)")
    return re.compile("|".join(parts), re.I) if parts else None


def has_phrase(text: str, phrases: Sequence[str]) -> bool:
    """Whether ``text`` contains one of ``phrases`` by the matching rule of the module docstring."""
    pattern = compile_phrases(tuple(phrases))
    return pattern is not None and pattern.search(text.replace("\u2019", "'")) is not None


@dataclass(frozen=True)
class ResponseFeatures:
    direct: bool
    steps: int
    reflection: bool
    backtrack: bool


def response_features(text: str, reflection_phrases: Sequence[str] = REFLECTION_PHRASES,
                      backtrack_phrases: Sequence[str] = BACKTRACK_PHRASES) -> ResponseFeatures:
    reasoning = reasoning_text(text)
    return ResponseFeatures(direct=is_direct(text), steps=count_steps(reasoning),
                            reflection=has_phrase(reasoning, reflection_phrases),
                            backtrack=has_phrase(reasoning, backtrack_phrases))


def emergence_metrics(texts: Sequence[str], *, correct: Sequence[bool] | None = None,
                      lengths: Sequence[int] | None = None,
                      reflection_phrases: Sequence[str] = REFLECTION_PHRASES,
                      backtrack_phrases: Sequence[str] = BACKTRACK_PHRASES) -> dict[str, float]:
    """The features of ``texts`` as rates and means (keys in the module docstring); NaN for no texts.

    ``lengths``: token counts (``mean_length`` in tokens), else characters; ``correct``: per-text
    correctness, which adds the accuracy split by reflection."""
    for name, values in (("correct", correct), ("lengths", lengths)):
        if values is not None and len(values) != len(texts):
            raise ValueError(f"emergence_metrics: {len(texts)} texts but {len(values)} {name}; give one per text")
    feats = [response_features(t, reflection_phrases, backtrack_phrases) for t in texts]
    out = {
        "direct_rate": _mean([f.direct for f in feats]),
        "mean_steps": _mean([f.steps for f in feats]),
        "reflection_rate": _mean([f.reflection for f in feats]),
        "backtrack_rate": _mean([f.backtrack for f in feats]),
        "mean_length": _mean(list(lengths) if lengths is not None else [len(t) for t in texts]),
    }
    if correct is not None:
        out["accuracy_with_reflection"] = _mean([c for c, f in zip(correct, feats) if f.reflection])
        out["accuracy_without_reflection"] = _mean([c for c, f in zip(correct, feats) if not f.reflection])
    return out


def phase_label(direct_rate: float, mean_steps: float, reflection_rate: float, backtrack_rate: float) -> str:
    """The seed's phase for measured features; the first rule that holds wins:

    1. direct_rate >= 0.5 or mean_steps < 2: direct answers with little reasoning;
    2. reflection_rate < 0.1: simple calculation steps;
    3. backtrack_rate < 0.05: step-by-step with self-checking;
    4. otherwise: structured reasoning with backtracking and verification."""
    if direct_rate >= DIRECT_PHASE_MIN_DIRECT_RATE or mean_steps < LITTLE_REASONING_MAX_STEPS:
        return PHASES[0]
    if reflection_rate < SELF_CHECK_MIN_REFLECTION_RATE:
        return PHASES[1]
    if backtrack_rate < BACKTRACK_MIN_RATE:
        return PHASES[2]
    return PHASES[3]


@dataclass(frozen=True)
class AhaVerdict:
    """``find_aha_step``'s answer with what it compared: the start level ``p0`` over the ``baseline`` steps
    (first, last), the rise span (the marked step to the last step of the last window checked for persistence;
    None without an aha) and, when an accuracy curve was given, its change over the rise span (mean over the rise
    span minus mean over the baseline steps, unweighted means of the logged values; None without an aha)."""

    step: int | None
    p0: float = math.nan
    baseline: tuple[int, int] | None = None
    rise: tuple[int, int] | None = None
    accuracy_change: float | None = None


def rise_threshold(p0: float, n0: float, rate: float, n: float, z: float = AHA_Z,
                   min_rise: float = AHA_MIN_RISE) -> float:
    """How far above ``p0`` (over ``n0`` completions) a rate over ``n`` completions must be to count as above it:
    ``max(z * se, min_rise)``, ``se = sqrt(q (1 - q) (1/n0 + 1/n))`` with ``q`` the pooled rate of both (the
    one-sided two-proportion z-test)."""
    pooled = (p0 * n0 + rate * n) / (n0 + n)
    return max(z * math.sqrt(pooled * (1 - pooled) * (1 / n0 + 1 / n)), min_rise)


def aha_verdict(steps: Sequence[int], values: Sequence[float], counts: Sequence[float | None] | None = None,
                accuracy: Sequence[float | None] | None = None, *, window: int = AHA_WINDOW,
                baseline: int = AHA_BASELINE, z: float = AHA_Z, min_rise: float = AHA_MIN_RISE,
                persist: int = AHA_PERSIST, default_count: float = AHA_DEFAULT_COUNT) -> AhaVerdict:
    """``find_aha_step``'s rule (see there), with the numbers it compared and, given ``accuracy`` (a value per
    step of ``steps``, NaN/None where not logged), the accuracy change over the rise (``AhaVerdict``)."""
    if window < 1 or baseline < 1 or persist < 0:
        raise ValueError(f"find_aha_step: window and baseline must be >= 1, persist >= 0 "
                         f"(got window={window}, baseline={baseline}, persist={persist})")
    counts = counts if counts is not None else [None] * len(steps)
    points = sorted((s, float(v), _count(n, default_count)) for s, v, n in zip(steps, values, counts)
                    if v is not None and not math.isnan(float(v)))
    if len(points) < baseline + window + persist:
        return AhaVerdict(None)
    hits = [0.0]  # prefix sums of completions with the feature, and of completions
    total = [0.0]
    for _, v, n in points:
        hits.append(hits[-1] + v * n)
        total.append(total[-1] + n)

    def above(i: int, j: int) -> tuple[bool, float]:  # points[i:j] above the start, and its threshold
        rate, n = (hits[j] - hits[i]) / (total[j] - total[i]), total[j] - total[i]
        threshold = rise_threshold(p0, total[baseline], rate, n, z, min_rise)
        return rate - p0 > threshold, threshold

    p0 = hits[baseline] / total[baseline]
    span = (points[0][0], points[baseline - 1][0])
    if not above(max(baseline, len(points) - baseline), len(points))[0]:
        return AhaVerdict(None, p0, span)  # does not end above the start: a dip-and-recover, a fall, noise
    ups = [above(end - window + 1, end + 1) for end in range(baseline + window - 1, len(points))]
    first = next((k for k in range(len(ups) - persist) if all(ok for ok, _ in ups[k:k + persist + 1])), None)
    if first is None:
        return AhaVerdict(None, p0, span)
    end = baseline + window - 1 + first
    threshold = ups[first][1]
    span_points = points[end - window + 1:end + 1]
    step = next((s for s, v, _ in span_points if v - p0 > threshold), span_points[0][0])  # one exists, bar rounding
    rise = (step, points[end + persist][0])
    return AhaVerdict(step, p0, span, rise, None if accuracy is None else _change(steps, accuracy, span, rise))


def find_aha_step(steps: Sequence[int], values: Sequence[float], counts: Sequence[float | None] | None = None, *,
                  window: int = AHA_WINDOW, baseline: int = AHA_BASELINE, z: float = AHA_Z,
                  min_rise: float = AHA_MIN_RISE, persist: int = AHA_PERSIST,
                  default_count: float = AHA_DEFAULT_COUNT) -> int | None:
    """The candidate "aha" step of a rate curve (reflection rate, checking rate), or None.

    ``values[i]`` is the share of ``counts[i]`` completions at ``steps[i]`` (a missing count, or no ``counts``:
    ``AHA_DEFAULT_COUNT``); NaN/None values are steps not logged, and steps are taken in order whatever the
    order given. The rule, over the logged steps (the defaults named are the module constants; each keyword
    argument overrides the one of its name):

    1. The start: the first ``AHA_BASELINE`` (10) steps; ``p0`` is their pooled rate (completions with the
       feature / completions), over ``N0`` completions.
    2. A span of steps is *above the start* when its pooled rate ``r`` (over ``N`` completions) exceeds
       ``p0`` by more than ``max(AHA_Z * se, AHA_MIN_RISE)`` (the larger of 3 standard errors and 5 points),
       ``se = sqrt(q (1 - q) (1/N0 + 1/N))``, ``q`` the pooled rate of the start and the span together.
    3. The curve must end above the start: its last ``AHA_BASELINE`` steps are; else no aha (a dip that
       recovers to the start, a fall, a spike, flat noise).
    4. Detection: the first window of ``AHA_WINDOW`` (5) steps after the start that is above the start and
       whose next ``AHA_PERSIST`` (10) windows (each ending one step later) are above it too.
    5. The step marked is the first step of the detecting window whose own value exceeds ``p0`` by more than
       that window's threshold (where the rise began, not where the average noticed it).

    Fewer than ``AHA_BASELINE + AHA_WINDOW + AHA_PERSIST`` logged steps: None. The threshold widens with
    binomial noise (few completions, rates near 0.5), so a flat noisy curve is not an aha; a real curve whose
    completions are more alike than independent draws (8 per prompt) is noisier than binomial, which the
    minimum rise and the persistence absorb. ``aha_verdict`` gives the numbers compared and the accuracy change."""
    return aha_verdict(steps, values, counts, window=window, baseline=baseline, z=z, min_rise=min_rise,
                       persist=persist, default_count=default_count).step


def _count(n: float | None, default: float) -> float:
    return default if n is None or math.isnan(float(n)) or n <= 0 else float(n)


def _change(steps: Sequence[int], accuracy: Sequence[float | None], base: tuple[int, int],
            rise: tuple[int, int]) -> float | None:
    """Mean accuracy over the ``rise`` steps minus over the ``base`` steps (both inclusive), None if either is empty."""
    logged = [(s, float(a)) for s, a in zip(steps, accuracy) if a is not None and not math.isnan(float(a))]
    before = [a for s, a in logged if base[0] <= s <= base[1]]
    after = [a for s, a in logged if rise[0] <= s <= rise[1]]
    return _mean(after) - _mean(before) if before and after else None


def _mean(values: Sequence[float | bool]) -> float:
    return float(sum(values)) / len(values) if values else math.nan
