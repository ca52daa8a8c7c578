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

# find_aha_step's defaults: rolling-mean window (steps) and rise above the running minimum (absolute share).
AHA_WINDOW = 5
AHA_DELTA = 0.1

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


def find_aha_step(steps: Sequence[int], values: Sequence[float], window: int = AHA_WINDOW,
                  delta: float = AHA_DELTA) -> int | None:
    """The candidate "aha" step of a reflection-rate curve, or None.

    Rule: ``m(t)`` is the mean of the ``window`` values ending at step t (full windows only, NaN values
    skipped as if not logged). Detection is at the first t where ``m(t)`` exceeds the minimum of all earlier
    ``m`` by more than ``delta``; the step marked is the first step of that window whose own value exceeds
    that minimum by more than ``delta`` (where the rise began, not where the average noticed it). A single
    spike lifts ``m`` by at most 1/window of its height, so it takes a rise that lasts to be marked."""
    if window < 1:
        raise ValueError(f"find_aha_step: window must be >= 1 (got {window})")
    points = sorted((s, float(v)) for s, v in zip(steps, values) if v is not None and not math.isnan(float(v)))
    lowest = math.inf
    for end in range(window - 1, len(points)):
        span = points[end - window + 1: end + 1]
        rolling = sum(v for _, v in span) / window
        if rolling - lowest > delta:
            return next(s for s, v in span if v - lowest > delta)
        lowest = min(lowest, rolling)
    return None


def _mean(values: Sequence[float | bool]) -> float:
    return float(sum(values)) / len(values) if values else math.nan
