"""R1's readability filters for reasoning samples: each check returns the reason it drops a sample, or None.

DeepSeek-R1 (sec. 2.3.3) "filtered out chain-of-thought with mixed languages, long paragraphs, and code blocks";
its cold-start data (sec. 2.3.1) was kept readable the same way. The filters here, in the order they are tried
(a sample is counted under the first one that drops it):

- ``truncated``: no closing ``</think>``, or nothing after it (no summary/answer to learn from).
- ``overlong``: more than ``max_chars`` characters or ``max_tokens`` tokens (the SFT budget).
- ``code_block``: a ``` fence inside the reasoning (the answer part may hold code).
- ``long_paragraph``: a paragraph of the reasoning (text between blank lines) over ``max_paragraph_chars``
  characters or ``max_paragraph_words`` words.
- ``mixed_language``: the prompt is in Latin script and over ``max_other_script_share`` of the reasoning's word
  units are CJK, or the other way round. Units are ``rewards.shaping.count_script_units``' (CJK: characters,
  Latin: words; code, math and tags ignored), the counting R1's language-consistency reward uses here.
  Departure from R1: only the CJK/Latin pair is checked (the one R1 reports); other scripts never drop.

Pure functions over text; ``filter_readable`` applies them all to ``{prompt, completion}`` rows.
"""

from __future__ import annotations

import re
from typing import Any, Callable

from grpo_core.config import ReadabilityConfig
from grpo_core.rewards.base import last_user_text
from grpo_core.rewards.shaping import count_script_units

FILTERS = ("truncated", "overlong", "code_block", "long_paragraph", "mixed_language")
_PARAGRAPH_BREAK = re.compile(r"\n\s*\n")


def split_reasoning(completion: str) -> tuple[str, str] | None:
    """``(reasoning, summary)`` around the first ``</think>`` (a leading ``<think>`` removed); None without one."""
    end = completion.find("</think>")
    if end < 0:
        return None
    reasoning = completion[:end].lstrip()
    if reasoning.startswith("<think>"):
        reasoning = reasoning[len("<think>"):]
    return reasoning, completion[end + len("</think>"):]


def reasoning_of(completion: str) -> str:
    """The reasoning part: before ``</think>``, or the whole completion when it never closes."""
    parts = split_reasoning(completion)
    return parts[0] if parts else completion.removeprefix("<think>")


def check_truncated(completion: str) -> str | None:
    parts = split_reasoning(completion)
    if parts is None:
        return "truncated: no closing </think>"
    if not parts[1].strip():
        return "truncated: nothing after </think> (no summary or answer)"
    return None


def check_overlong(completion: str, max_chars: int | None = None, max_tokens: int | None = None,
                   num_tokens: int | None = None) -> str | None:
    if max_chars is not None and len(completion) > max_chars:
        return f"overlong: {len(completion)} characters > max_chars {max_chars}"
    if max_tokens is not None:
        if num_tokens is None:
            raise ValueError("max_tokens is set but no token count was given; pass a tokenizer to filter_readable")
        if num_tokens > max_tokens:
            return f"overlong: {num_tokens} tokens > max_tokens {max_tokens}"
    return None


def check_code_block(reasoning: str) -> str | None:
    return "code_block: a ``` fence in the reasoning" if "```" in reasoning else None


def check_long_paragraph(reasoning: str, max_chars: int | None = None, max_words: int | None = None) -> str | None:
    for i, paragraph in enumerate(_PARAGRAPH_BREAK.split(reasoning), start=1):
        text = paragraph.strip()
        if max_chars is not None and len(text) > max_chars:
            return f"long_paragraph: paragraph {i} has {len(text)} characters > {max_chars}"
        if max_words is not None and len(text.split()) > max_words:
            return f"long_paragraph: paragraph {i} has {len(text.split())} words > {max_words}"
    return None


def check_mixed_language(reasoning: str, prompt: str, max_other_share: float) -> str | None:
    """Drop when the reasoning's share of the script the prompt is NOT in (CJK vs Latin) exceeds the threshold."""
    prompt_units = count_script_units(prompt)
    if not prompt_units["latin"] and not prompt_units["cjk"]:
        return None  # neither script: this filter does not apply
    target = "latin" if prompt_units["latin"] >= prompt_units["cjk"] else "cjk"
    other = "cjk" if target == "latin" else "latin"
    units = count_script_units(reasoning)
    total = units["latin"] + units["cjk"]
    share = units[other] / total if total else 0.0
    if share > max_other_share:
        return f"mixed_language: {share:.0%} of the reasoning is {other}, the prompt is {target}"
    return None


def readability_reason(completion: str, prompt: Any, config: ReadabilityConfig,
                       num_tokens: int | None = None) -> str | None:
    """The first filter that drops ``completion`` (its message starts with the filter name), or None to keep it."""
    checks: list[Callable[[], str | None]] = []
    if config.drop_truncated:
        checks.append(lambda: check_truncated(completion))
    checks.append(lambda: check_overlong(completion, config.max_chars, config.max_tokens, num_tokens))
    reasoning = reasoning_of(completion)
    if config.drop_code_blocks:
        checks.append(lambda: check_code_block(reasoning))
    checks.append(lambda: check_long_paragraph(reasoning, config.max_paragraph_chars, config.max_paragraph_words))
    if config.max_other_script_share is not None:
        checks.append(lambda: check_mixed_language(reasoning, last_user_text(prompt), config.max_other_script_share))
    for check in checks:
        reason = check()
        if reason:
            return reason
    return None


def filter_readable(rows: list[dict[str, Any]], config: ReadabilityConfig, tokenizer: Any = None
                    ) -> tuple[list[dict[str, Any]], dict[str, int]]:
    """``(kept rows, {filter: rows it dropped})`` for ``{prompt, completion}`` rows; every filter has a count."""
    if config.max_tokens is not None and tokenizer is None:
        raise ValueError("readability.max_tokens needs a tokenizer to count tokens; pass one or use max_chars")
    counts = dict.fromkeys(FILTERS, 0)
    kept = []
    for row in rows:
        completion = row["completion"]
        num_tokens = (len(tokenizer(completion, add_special_tokens=False)["input_ids"])
                      if config.max_tokens is not None else None)
        reason = readability_reason(completion, row["prompt"], config, num_tokens)
        if reason is None:
            kept.append(row)
        else:
            counts[reason.split(":", 1)[0]] += 1
    return kept, counts
