"""Find the final answer in a model's completion (``extract_answer``) or in a reference solution
(``parse_gold_answer``), the way each is written, in linear time.

Order (the first that exists wins):
  1. the last closed ``<answer>...</answer>`` (R1's template); a ``\\boxed{}`` inside it is unwrapped;
  2. the last ``\\boxed{...}`` / ``\\fbox{...}`` with balanced, nested braces (one left-to-right scan with a
     depth counter; no recursive regex, so 5,000 nested braces cost 5,000 steps), joined with the boxes before
     it that math-verify reads as the same answer (``\\boxed{(2, 2)} \\text{ and } \\boxed{(6, 2)}`` ->
     ``"(2, 2), (6, 2)"``, a set; ``\\boxed{5}. Let me check this again carefully. \\boxed{6}`` -> ``"6"``).
     A "final answer ... is" statement after the last box (Minerva's "Final Answer: The final answer is $X$.
     I hope it is correct.") outranks the box, as in math-verify: the text after the box is read as in 3,
     with the box as the fallback;
  3. otherwise the tail itself (kind ``"tail"``): math-verify's own LaTeX + expression extraction reads it in
     the verifier (``math.check_answer``), and only when that finds nothing does the last number count (the
     seed's fallback, read as models write numbers: ``1,000``, ``-3.5``, ``$18``, ``25%`` -> ``"1000"``,
     ``"-3.5"``, ``"18"``, ``"25"``). The number never overrides a LaTeX answer math-verify found.

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
import unicodedata
from dataclasses import dataclass
from typing import Any, Iterator, Literal

MAX_TAIL_CHARS = 4000

AnswerKind = Literal["answer", "boxed", "tail"]
GoldFormat = Literal["auto", "raw", "gsm8k", "boxed"]

_ANSWER_CLOSE = re.compile(r"</answer\s*>", re.IGNORECASE)
_ANSWER_OPEN = re.compile(r"<answer\s*>", re.IGNORECASE)
_BOX_OPEN = re.compile(r"\\(?:boxed|fbox)\s*\{")
_FINAL_ANSWER = re.compile(r"final answer.{0,100}?\s+is", re.IGNORECASE | re.DOTALL)  # as math-verify anchors it
# math-verify's rule (latex2sympy2_extended ``extract_boxed_content``) for boxes that are one answer: fewer
# than 10 characters apart, or fewer than 70 with a separator between them and a different content. One
# departure: boxes fewer than 10 apart with a word between them ("\boxed{1} then \boxed{2}") are not joined.
_NEAR_BOXES, _FAR_BOXES = 10, 70
_BOX_SEPARATOR = re.compile(r"\b(?:and|or)\b|,|;")
_WORD = re.compile(r"(?<!\\)\b[^\W\d_]+")  # letters not part of a \command such as \quad
# A number as written in prose: optional sign and currency, thousands groups or plain digits, decimals, %.
_THOUSANDS = re.compile(r"[-+]?[1-9]\d{0,2}(?:,\d{3})+(?:\.\d+)?")  # "1,234" / "-12,345.5", not "0,111"
_NUMBER = re.compile(
    r"(?<![\w.])(-|−)?\s?\\?\$?\s?((?:\d{1,3}(?:,\d{3})+|\d+)(?:\.\d+)?|\.\d+)(?!\d)"
)


@dataclass(frozen=True)
class ExtractedAnswer:
    text: str  # the answer as written (box / tag content); for kind "tail" the fallback: box or last number
    kind: AnswerKind
    tail: str = ""  # kind "tail": the text math-verify's extraction reads first (``text`` counts if it finds none)


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
    """``(start, end)`` of the last balanced box's content (``text[end]`` is its closing ``}``)."""
    last = next(_boxed_spans_from_last(text), None)
    return None if last is None else (last[1], last[2])


def _boxed_spans_from_last(text: str) -> Iterator[tuple[int, int, int]]:
    """``(command start, content start, content end)`` of every balanced box, last first.

    One forward scan pairs every ``{`` with its ``}`` through a stack (escaped ``\\{`` / ``\\}`` are
    literal braces), so nesting 5,000 deep or 500 unclosed boxes still cost one pass over the text.
    """
    opens = list(_BOX_OPEN.finditer(text))
    if not opens:
        return
    closing = _match_braces(text)
    for m in reversed(opens):
        end = closing.get(m.end() - 1)
        if end is not None:
            yield m.start(), m.end(), end


def find_boxed_answer(text: str) -> str | None:
    """The boxed answer of ``text`` (``boxed_answer_span``), ``None`` without a balanced box."""
    found = boxed_answer_span(text)
    return None if found is None else found[0]


def boxed_answer_span(text: str) -> tuple[str, int] | None:
    """``(answer, end)``: the last balanced box's content, joined (``", "``) with the boxes before it that
    math-verify reads as parts of the same answer (fewer than 10 characters apart with no word between them,
    or fewer than 70 with "and", "or", "," or ";" between them): several boxes are one set-valued answer.
    Consecutive repeats are dropped; a box further away is an earlier attempt and does not count.
    ``text[end]`` is the last box's closing brace."""
    spans = _boxed_spans_from_last(text)
    last = next(spans, None)
    if last is None:
        return None
    command, start, last_end = last
    parts = [text[start:last_end].strip()]
    for prev_command, prev_start, prev_end in spans:
        between = text[prev_end + 1 : command]
        content = text[prev_start:prev_end].strip()
        near = (len(between) < _NEAR_BOXES and not _WORD.search(between)) or (
            len(between) < _FAR_BOXES and content != parts[-1] and _BOX_SEPARATOR.search(between)
        )
        if prev_end >= command or not near:
            break  # nested in the later box, or too far from it: the later box is the answer
        if content != parts[-1]:
            parts.append(content)
        command = prev_command
    return ", ".join(reversed(parts)), last_end


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
    """The last number in ``text``, normalised: thousands commas, ``$`` and ``%`` dropped, digits of any script
    (``６``, ``٣``) written in ASCII; ``None`` if none."""
    last = None
    for last in _NUMBER.finditer(text):
        pass
    if last is None:
        return None
    sign = "-" if last.group(1) else ""
    digits = "".join(str(unicodedata.digit(c)) if c.isdigit() else c for c in last.group(2).replace(",", ""))
    if digits.startswith("."):
        digits = "0" + digits
    return sign + digits


def extract_answer(completion: Any, max_chars: int = MAX_TAIL_CHARS) -> ExtractedAnswer | None:
    """The final answer of a completion: last ``<answer>``, else the last box(es), else the tail (for
    math-verify's extraction, then the last number); ``None`` for a blank completion."""
    text = to_safe_text(completion, max_chars)
    tagged = find_last_answer_tag(text)
    if tagged is not None:
        boxed = find_boxed_answer(tagged)
        return ExtractedAnswer(boxed if boxed is not None else tagged, "answer")
    boxed = boxed_answer_span(text)
    if boxed is not None:
        after = text[boxed[1] + 1 :]
        if _FINAL_ANSWER.search(after):  # Minerva's "The final answer is $X$." after the boxes outranks them
            return ExtractedAnswer(boxed[0], "tail", after)
        return ExtractedAnswer(boxed[0], "boxed")
    if not text.strip():
        return None
    return ExtractedAnswer(find_last_number(text) or "", "tail", text)


def parse_gold_answer(answer: Any, answer_format: GoldFormat = "auto") -> str:
    """The bare ground-truth answer of a reference solution: ``"... #### 1,234"`` -> ``"1234"``,
    ``"so \\boxed{\\frac{1}{2}}."`` -> ``"\\frac{1}{2}"``, ``"$5$"`` -> ``"5"``.

    ``raw``: the text stripped, nothing else. ``gsm8k``: the text after the last ``####`` (ValueError without
    one). ``boxed``: the last balanced ``\\boxed{}``/``\\fbox{}`` content, joined with the boxes before it
    that belong to the same answer, as for completions (``find_boxed_answer``; ValueError without one).
    ``auto``: the ``####`` tail when there is one, then the boxed answer when there is one. After that (all but
    ``raw``) thousands commas of a plain number are dropped and one ``$...$`` pair is unwrapped.
    """
    text = to_safe_text(answer if isinstance(answer, (str, bytes)) else str(answer), sys.maxsize).strip()
    if answer_format == "raw":
        return text
    if answer_format == "gsm8k" or (answer_format == "auto" and "####" in text):
        if "####" not in text:
            raise ValueError("no '####' marker")
        text = text.rsplit("####", 1)[1].strip()
    boxed = find_boxed_answer(text)
    if boxed is not None:
        text = boxed
    elif answer_format == "boxed":
        raise ValueError("no balanced \\boxed{...}")
    if len(text) >= 2 and text[0] == "$" and text[-1] == "$" and "$" not in text.strip("$"):
        text = text.strip("$").strip()  # "$5$" / "$$5$$", not "$1$ and $2$"
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
