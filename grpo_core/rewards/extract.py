"""Find the final answer in a model's completion (``extract_answer``) or in a reference solution
(``parse_gold_answer``), the way each is written, in linear time.

Order (the first that exists wins):
  1. the last closed ``<answer>...</answer>`` (R1's template); a ``\\boxed{}`` inside it is unwrapped;
  2. the last ``\\boxed{...}`` / ``\\fbox{...}`` with balanced, nested braces (one left-to-right scan with a
     depth counter; no recursive regex, so 5,000 nested braces cost 5,000 steps);
  3. the last number (the seed's fallback), read as models write numbers: ``1,000``, ``-3.5``, ``$18``,
     ``25%`` -> ``"1000"``, ``"-3.5"``, ``"18"``, ``"25"``.

Untrusted text is first made safe: bytes and lone surrogates become valid str (invalid UTF-8 -> U+FFFD) and
only the tail (``MAX_TAIL_CHARS``) is parsed, since the answer is at the end and a 10 MB completion must not
cost 10 MB of parsing. Departure from the seed: its ``re.search(r'\\boxed\\{([^}]+)\\}')`` takes the FIRST box
and stops at the first ``}``, so ``\\boxed{\\frac{1}{2}}`` gives ``\\frac{1``; ``seed_math_reward`` keeps that
formula verbatim as the baseline the tests compare against.

Ground truth has one parser, ``parse_gold_answer``: data preparation stores its result as a row's ``answer``
and ``math_accuracy`` applies it again to whatever ``answer`` column it is given (a second pass changes
nothing), so a raw GSM8K solution and a prepared row score the same.
"""

from __future__ import annotations

import re
import sys
from dataclasses import dataclass
from typing import Any, Literal

MAX_TAIL_CHARS = 4000

AnswerKind = Literal["answer", "boxed", "number"]
GoldFormat = Literal["auto", "raw", "gsm8k", "boxed"]

_ANSWER_CLOSE = re.compile(r"</answer\s*>", re.IGNORECASE)
_ANSWER_OPEN = re.compile(r"<answer\s*>", re.IGNORECASE)
_BOX_OPEN = re.compile(r"\\(?:boxed|fbox)\s*\{")
# A number as written in prose: optional sign and currency, thousands groups or plain digits, decimals, %.
_THOUSANDS = re.compile(r"[-+]?\d{1,3}(?:,\d{3})+(?:\.\d+)?")  # "1,234" / "-12,345.5"
_NUMBER = re.compile(
    r"(?<![\w.])(-|−)?\s?\\?\$?\s?((?:\d{1,3}(?:,\d{3})+|\d+)(?:\.\d+)?|\.\d+)(?!\d)"
)


@dataclass(frozen=True)
class ExtractedAnswer:
    text: str  # the answer as written (box content, tag content, or a normalised number)
    kind: AnswerKind


def to_safe_text(completion: Any, max_chars: int = MAX_TAIL_CHARS) -> str:
    """A valid-UTF-8 ``str`` holding the last ``max_chars`` characters of ``completion`` (str or bytes)."""
    if isinstance(completion, (bytes, bytearray, memoryview)):
        raw = bytes(completion[-4 * max_chars :])  # a UTF-8 char is at most 4 bytes
        text = raw.decode("utf-8", errors="replace")
    elif isinstance(completion, str):
        text = completion[-max_chars:]
        try:
            text.encode("utf-8")
        except UnicodeEncodeError:  # lone surrogates (e.g. from errors="surrogateescape")
            text = text.encode("utf-8", errors="replace").decode("utf-8", errors="replace")
    else:
        text = str(completion)[-max_chars:]
    text = text[-max_chars:]
    return text.replace("\x00", "")


def find_last_answer_tag(text: str) -> str | None:
    """Content of the last closed ``<answer>...</answer>``, stripped; ``None`` if there is none."""
    closes = list(_ANSWER_CLOSE.finditer(text))
    if not closes:
        return None
    close = closes[-1]
    opens = [m for m in _ANSWER_OPEN.finditer(text, 0, close.start())]
    if not opens:
        return None
    return text[opens[-1].end() : close.start()].strip()


def find_last_boxed(text: str) -> str | None:
    """Content of the last balanced ``\\boxed{...}`` or ``\\fbox{...}``; unclosed boxes are skipped."""
    span = find_last_boxed_span(text)
    return None if span is None else text[span[0] : span[1]].strip()


def find_last_boxed_span(text: str) -> tuple[int, int] | None:
    """``(start, end)`` of the last balanced box's content (``text[end]`` is its closing ``}``).

    One forward scan pairs every ``{`` with its ``}`` through a stack (escaped ``\\{`` / ``\\}`` are
    literal braces), so nesting 5,000 deep or 500 unclosed boxes still cost one pass over the text.
    """
    starts = [m.end() for m in _BOX_OPEN.finditer(text)]  # index just after each box's "{"
    if not starts:
        return None
    closing = _match_braces(text)
    for start in reversed(starts):
        end = closing.get(start - 1)
        if end is not None:
            return start, end
    return None


def _match_braces(text: str) -> dict[int, int]:
    """``{open index: close index}`` for every balanced brace pair of ``text`` (one linear scan)."""
    pairs: dict[int, int] = {}
    stack: list[int] = []
    i, n = 0, len(text)
    while i < n:
        ch = text[i]
        if ch == "\\":
            i += 2  # \{ \} \\ are not structure
            continue
        if ch == "{":
            stack.append(i)
        elif ch == "}" and stack:
            pairs[stack.pop()] = i
        i += 1
    return pairs


def find_last_number(text: str) -> str | None:
    """The last number in ``text``, normalised: thousands commas, ``$`` and ``%`` dropped; ``None`` if none."""
    last = None
    for last in _NUMBER.finditer(text):
        pass
    if last is None:
        return None
    sign = "-" if last.group(1) else ""
    digits = last.group(2).replace(",", "")
    if digits.startswith("."):
        digits = "0" + digits
    return sign + digits


def extract_answer(completion: Any, max_chars: int = MAX_TAIL_CHARS) -> ExtractedAnswer | None:
    """The final answer of a completion: last ``<answer>``, else last box, else last number."""
    text = to_safe_text(completion, max_chars)
    tagged = find_last_answer_tag(text)
    if tagged is not None:
        boxed = find_last_boxed(tagged)
        return ExtractedAnswer(boxed if boxed is not None else tagged, "answer")
    boxed = find_last_boxed(text)
    if boxed is not None:
        return ExtractedAnswer(boxed, "boxed")
    number = find_last_number(text)
    if number is not None:
        return ExtractedAnswer(number, "number")
    return None


def parse_gold_answer(answer: Any, answer_format: GoldFormat = "auto") -> str:
    """The bare ground-truth answer of a reference solution: ``"... #### 1,234"`` -> ``"1234"``,
    ``"so \\boxed{\\frac{1}{2}}."`` -> ``"\\frac{1}{2}"``, ``"$5$"`` -> ``"5"``.

    ``raw``: the text stripped, nothing else. ``gsm8k``: the text after the last ``####`` (ValueError without
    one). ``boxed``: the last balanced ``\\boxed{}``/``\\fbox{}`` content (ValueError without one). ``auto``:
    the ``####`` tail when there is one, then the last box's content when there is one. After that (all but
    ``raw``) thousands commas of a plain number are dropped and one ``$...$`` pair is unwrapped.
    """
    text = to_safe_text(answer if isinstance(answer, (str, bytes)) else str(answer), sys.maxsize).strip()
    if answer_format == "raw":
        return text
    if answer_format == "gsm8k" or (answer_format == "auto" and "####" in text):
        if "####" not in text:
            raise ValueError("no '####' marker")
        text = text.rsplit("####", 1)[1].strip()
    boxed = find_last_boxed(text)
    if boxed is not None:
        text = boxed
    elif answer_format == "boxed":
        raise ValueError("no balanced \\boxed{...}")
    if len(text) >= 2 and text[0] == "$" and text[-1] == "$":
        text = text.strip("$").strip()
    return text.replace(",", "") if _THOUSANDS.fullmatch(text) else text


def seed_math_reward(response: str, ground_truth: str) -> float:
    """The seed's ``math_reward`` (question argument dropped), transcribed literally: the baseline to beat."""
    # 1. 尝试从 \boxed{} 中提取答案
    boxed_match = re.search(r"\\boxed\{([^}]+)\}", response)
    if boxed_match:
        predicted = boxed_match.group(1).strip()
    else:
        # 2. 回退：提取最后一个数字
        numbers = re.findall(r"-?\d+\.?\d*", response)
        if numbers:
            predicted = numbers[-1]
        else:
            return 0.0  # 无法提取答案

    # 3. 比较答案
    try:
        if float(predicted) == float(ground_truth):
            return 1.0
        else:
            return 0.0
    except ValueError:
        return 1.0 if predicted.strip() == ground_truth.strip() else 0.0
