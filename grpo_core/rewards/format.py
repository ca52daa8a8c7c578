"""``format``: 1.0 when a completion is ``<think>reasoning</think>`` followed by a final answer, else 0.0.

R1-Zero's format reward checks the template ``<think>...</think><answer>...</answer>``; models trained with a
``\\boxed{}`` prompt answer in a box instead, so both forms count. The rules, decided here:
- Leading whitespace is allowed; then the completion starts with ``<think>``. If the prompt (a string) ends
  with ``<think>`` (templates that pre-fill it), the completion may start inside the reasoning instead.
- Exactly one ``<think>`` and one ``</think>``, with non-blank reasoning between them.
- After ``</think>``, either ``<answer>non-blank</answer>`` (one pair; only whitespace before and after it), or
  a summary whose last balanced ``\\boxed{non-blank}`` is followed only by whitespace, punctuation or
  closing math delimiters (``$``, ``\\]``, ``\\)``), e.g. ``The answer is $\\boxed{5}$.``
- The answer part must fit in ``MAX_TAIL_CHARS`` (the part ``math_accuracy`` reads).
All checks are ``str.find``/``count`` or one brace scan: linear in the completion length.
"""

from __future__ import annotations

import re
from typing import Any

from grpo_core.rewards.base import completion_text
from grpo_core.rewards.extract import MAX_TAIL_CHARS, find_last_boxed_span, to_safe_text

_AFTER_BOX = re.compile(r"(?:[\s.,;:!$]|\\[\])])*")  # one token per step: no backtracking blow-up


def has_think_answer_format(completion: str, prefilled_think: bool = False) -> bool:
    """Whether ``completion`` follows ``<think>...</think>`` + answer (see the module docstring)."""
    text = completion.lstrip()
    if prefilled_think and not text.startswith("<think>"):
        text = "<think>" + text
    if not text.startswith("<think>") or text.count("<think>") != 1 or text.count("</think>") != 1:
        return False
    end = text.find("</think>")
    if not text[len("<think>") : end].strip():
        return False
    rest = text[end + len("</think>") :].strip()
    if not rest or len(rest) > MAX_TAIL_CHARS:
        return False
    if rest.startswith("<answer>"):
        return (
            rest.endswith("</answer>")
            and rest.count("<answer>") == 1
            and rest.count("</answer>") == 1
            and bool(rest[len("<answer>") : -len("</answer>")].strip())
        )
    if "<answer>" in rest or "</answer>" in rest:
        return False
    return _ends_with_box(rest)


def _ends_with_box(text: str) -> bool:
    span = find_last_boxed_span(text)
    if span is None:
        return False
    start, close = span
    return bool(text[start:close].strip()) and _AFTER_BOX.fullmatch(text, close + 1) is not None


def _prompt_prefills_think(prompt: Any) -> bool:
    return isinstance(prompt, str) and prompt.rstrip().endswith("<think>")


def format_reward(completions: list[Any], **kwargs: Any) -> list[float | None]:
    """TRL reward: 1.0 per completion in the ``<think>...</think>`` + answer form, else 0.0."""
    prompts = kwargs.get("prompts") or [None] * len(completions)
    scores: list[float | None] = []
    for completion, prompt in zip(completions, prompts, strict=True):
        raw = completion_text(completion)
        text = to_safe_text(raw, max_chars=len(raw))
        scores.append(1.0 if has_think_answer_format(text, _prompt_prefills_think(prompt)) else 0.0)
    return scores
