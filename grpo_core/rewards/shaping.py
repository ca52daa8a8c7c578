"""Shaping rewards: DAPO's soft overlong punishment and R1's language-consistency reward.

``overlong_penalty`` is eq. 13 of DAPO (Yu et al., 2025), with L_max = ``max_completion_length`` and
L_cache = ``overlong_buffer``::

    R_length(y) = 0                                   if |y| <= L_max - L_cache
                  ((L_max - L_cache) - |y|) / L_cache if L_max - L_cache < |y| <= L_max
                  -1                                  if L_max < |y|

|y| is the number of completion tokens (``completion_ids``, as the trainer passes them, EOS included when
present). DAPO used L_max = 20480 with L_cache = 4096; the registered function defaults the buffer to a fifth
of ``max_completion_length`` in the same ratio. ``make_overlong_penalty`` fixes both.

``language_consistency`` is R1's reward for the final RL stage (DeepSeek-AI, 2025, sec. 2.3.3): the share of
the completion written in the target language. Departures: R1 does not say how words are counted; here the
target is the dominant script of the prompt's last user message (Unicode ranges: Latin, CJK (Han + kana),
Hangul, Cyrillic, Greek, Arabic, Hebrew, Devanagari, Thai; other letters count as "other"). CJK and Thai count
one unit per character (no spaces between words); other scripts one unit per word (a run of letters).
Ignored: code (fenced and inline), LaTeX math (``$..$``, ``$$..$$``, ``\\(..\\)``, ``\\[..\\]``) and commands,
XML-like tags (``<think>``), URLs, digits, punctuation, and single-letter words (math variables such as
``x``). R1 measured the CoT; this scores the whole completion (CoT and answer). A completion with no
countable words scores 1.0; a prompt with none scores ``None`` (the reward does not apply).
"""

from __future__ import annotations

import bisect
import re
import unicodedata
from collections import Counter
from typing import Any, Callable

from grpo_core.rewards.base import completion_text, last_user_text

# ---------------------------------------------------------------- DAPO soft overlong punishment


def soft_overlong_penalty(length: int, max_completion_length: int, overlong_buffer: int) -> float:
    """DAPO eq. 13 for one completion of ``length`` tokens."""
    expected = max_completion_length - overlong_buffer  # L_max - L_cache
    if length <= expected:
        return 0.0
    if length <= max_completion_length:
        return (expected - length) / overlong_buffer  # linear from 0 down to -1 inside the buffer
    return -1.0


def _check_lengths(max_completion_length: int, overlong_buffer: int) -> None:
    if not 0 < overlong_buffer <= max_completion_length:
        raise ValueError(
            f"overlong_buffer must be in (0, max_completion_length={max_completion_length}], got {overlong_buffer}"
        )


def make_overlong_penalty(max_completion_length: int, overlong_buffer: int) -> Callable[..., list[float | None]]:
    """``overlong_penalty`` with L_max and L_cache fixed (the trainer's kwargs are then ignored)."""
    _check_lengths(max_completion_length, overlong_buffer)

    def overlong_penalty(completions: list[Any], completion_ids: list[list[int]] | None = None,
                         **kwargs: Any) -> list[float | None]:
        if completion_ids is None:
            raise ValueError("overlong_penalty needs completion_ids (the trainer passes them)")
        return [soft_overlong_penalty(len(ids), max_completion_length, overlong_buffer) for ids in completion_ids]

    return overlong_penalty


def overlong_penalty(completions: list[Any], completion_ids: list[list[int]] | None = None,
                     max_completion_length: int | None = None, overlong_buffer: int | None = None,
                     **kwargs: Any) -> list[float | None]:
    """DAPO's soft overlong punishment from the trainer's ``completion_ids`` and ``max_completion_length``."""
    if completion_ids is None or max_completion_length is None:
        raise ValueError(
            "overlong_penalty needs completion_ids and max_completion_length (the trainer passes both); "
            "outside the trainer use make_overlong_penalty(max_completion_length, overlong_buffer)"
        )
    buffer = overlong_buffer if overlong_buffer is not None else max(1, max_completion_length // 5)
    _check_lengths(max_completion_length, buffer)
    return [soft_overlong_penalty(len(ids), max_completion_length, buffer) for ids in completion_ids]


# ---------------------------------------------------------------- R1 language consistency

# (first, last, script) code point ranges, sorted; letters outside them count as "other"
_RANGES: list[tuple[int, int, str]] = sorted([
    (0x0041, 0x005A, "latin"), (0x0061, 0x007A, "latin"), (0x00C0, 0x024F, "latin"), (0x1E00, 0x1EFF, "latin"),
    (0x0370, 0x03FF, "greek"), (0x1F00, 0x1FFF, "greek"),
    (0x0400, 0x052F, "cyrillic"),
    (0x0590, 0x05FF, "hebrew"),
    (0x0600, 0x06FF, "arabic"), (0x0750, 0x077F, "arabic"), (0x08A0, 0x08FF, "arabic"),
    (0xFB50, 0xFDFF, "arabic"), (0xFE70, 0xFEFF, "arabic"),
    (0x0900, 0x097F, "devanagari"),
    (0x0E00, 0x0E7F, "thai"),
    (0x1100, 0x11FF, "hangul"), (0x3130, 0x318F, "hangul"), (0xAC00, 0xD7AF, "hangul"),
    (0x3040, 0x30FF, "cjk"), (0x31F0, 0x31FF, "cjk"), (0x3400, 0x4DBF, "cjk"), (0x4E00, 0x9FFF, "cjk"),
    (0xF900, 0xFAFF, "cjk"), (0x20000, 0x2FFFF, "cjk"),
])
_STARTS = [lo for lo, _, _ in _RANGES]
_PER_CHAR = {"cjk", "thai"}  # scripts written without spaces between words: one unit per character
_IGNORED = re.compile(  # each alternative that opens runs to its close or to the end: linear time
    r"```.*?(?:```|\Z)"  # fenced code
    r"|`[^`\n]*`"  # inline code
    r"|\$\$.*?(?:\$\$|\Z)|\$[^$]*\$"  # display and inline math
    r"|\\\[.*?(?:\\\]|\Z)|\\\(.*?(?:\\\)|\Z)"  # \[ .. \] and \( .. \)
    r"|\\[a-zA-Z]+"  # LaTeX commands (\frac, \boxed, \text ...)
    r"|</?[A-Za-z_][\w-]*>"  # tags such as <think>, </answer>
    r"|https?://\S+",
    re.DOTALL,
)
MAX_CHARS = 100_000  # long completions are scored on their first and last halves of this


def _script(ch: str) -> str | None:
    """The script of a letter or combining mark (marks continue the word they sit on); None otherwise."""
    if not (ch.isalpha() or unicodedata.category(ch).startswith("M")):
        return None
    cp = ord(ch)
    i = bisect.bisect_right(_STARTS, cp) - 1
    if i >= 0 and cp <= _RANGES[i][1]:
        return _RANGES[i][2]
    return "other"


def count_script_units(text: str) -> Counter[str]:
    """Word units per script, code/math/markup removed (CJK and Thai: characters; others: words of 2+ letters)."""
    if len(text) > MAX_CHARS:
        text = text[: MAX_CHARS // 2] + "\n" + text[-MAX_CHARS // 2 :]
    text = _IGNORED.sub(" ", text)
    units: Counter[str] = Counter()
    run_script, run_len = None, 0
    for ch in text + " ":
        script = _script(ch)
        if script is not None and not ch.isalpha():  # a combining mark: part of the current word
            script = run_script
        elif script in _PER_CHAR:
            units[script] += 1
        if script != run_script or script in _PER_CHAR:
            if run_script is not None and run_script not in _PER_CHAR and run_len >= 2:
                units[run_script] += 1  # a word ends
            run_script, run_len = script, 0
        run_len += 1
    return units


def dominant_script(text: str) -> str | None:
    units = count_script_units(text)
    return units.most_common(1)[0][0] if units else None


def language_share(completion: str, target: str) -> float:
    """Share of the completion's word units written in ``target`` script; 1.0 when there are none."""
    units = count_script_units(completion)
    total = sum(units.values())
    return units[target] / total if total else 1.0


def language_consistency(completions: list[Any], prompts: list[Any] | None = None,
                         **kwargs: Any) -> list[float | None]:
    """R1's language-consistency reward: share of each completion in its prompt's script."""
    if prompts is None:
        raise ValueError("language_consistency needs prompts (the trainer passes them)")
    scores: list[float | None] = []
    for completion, prompt in zip(completions, prompts):
        target = dominant_script(last_user_text(prompt))
        scores.append(None if target is None else language_share(completion_text(completion), target))
    return scores
