"""Readability filters (R1 sec. 2.3.3): each filter drops a sample it must drop and keeps one it must keep."""

from __future__ import annotations

import pytest

from grpo_core.config import ReadabilityConfig
from grpo_core.data.readability import FILTERS, filter_readable, readability_reason

EN_PROMPT = [{"role": "user", "content": "What is the sum of the first ten positive integers?"}]
ZH_PROMPT = [{"role": "user", "content": "前十个正整数的和是多少？"}]
GOOD = "<think>Add them in pairs: 1+10, 2+9, and so on, five pairs of 11.\n\nSo the sum is 55.</think>The answer is $\\boxed{55}$."

# filter -> (prompt, a completion it must drop, a completion it must keep, config)
CASES = {
    "truncated": (EN_PROMPT, "<think>Add them in pairs: 1+10, 2+9, and so on", GOOD, ReadabilityConfig()),
    "truncated_no_answer": (EN_PROMPT, "<think>Pairs of eleven, five of them.</think>\n  ", GOOD, ReadabilityConfig()),
    "overlong": (EN_PROMPT, GOOD + " " * 10 + "Done.", GOOD, ReadabilityConfig(max_chars=len(GOOD) + 5)),
    "code_block": (EN_PROMPT, "<think>Compute it:\n```python\nprint(sum(range(11)))\n```\nIt prints 55.</think>55",
                   "<think>Compute sum(range(11)) by hand: 55.</think>Answer: ```55```", ReadabilityConfig()),
    "long_paragraph": (EN_PROMPT, "<think>" + "pairs of eleven " * 30 + "</think>55",
                       "<think>" + "pairs of eleven\n\n" * 30 + "</think>55", ReadabilityConfig(max_paragraph_chars=200)),
    "long_paragraph_words": (EN_PROMPT, "<think>" + "one two three " * 10 + "</think>55",
                             "<think>" + "one two three\n\n" * 10 + "</think>55",
                             ReadabilityConfig(max_paragraph_words=20)),
    "mixed_language": (EN_PROMPT, "<think>Add them in pairs, 每一对的和是十一，一共有五对，所以答案是五十五。</think>55",
                       "<think>Add them in pairs, each pair sums to eleven, so five pairs make 55 (五十五).</think>55",
                       ReadabilityConfig(max_other_script_share=0.2)),
    "mixed_language_zh": (ZH_PROMPT, "<think>We add them in pairs: each pair sums to eleven, five pairs.</think>55",
                          "<think>两两相加，每一对的和是十一，一共有五对 (pairs)。</think>55", ReadabilityConfig()),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_each_filter_drops_its_sample_and_keeps_the_other(case):
    prompt, bad, good, config = CASES[case]
    name = case.split("_no_")[0].removesuffix("_words").removesuffix("_zh")
    reason = readability_reason(bad, prompt, config)
    assert reason is not None and reason.startswith(name + ":"), reason
    assert readability_reason(good, prompt, config) is None


def test_a_filter_that_is_off_keeps_its_sample():
    off = ReadabilityConfig(drop_truncated=False, drop_code_blocks=False, max_other_script_share=None,
                            max_paragraph_chars=None)
    for case in ("truncated", "code_block", "mixed_language"):
        prompt, bad, _, _ = CASES[case]
        assert readability_reason(bad, prompt, off) is None, case


def test_filter_readable_counts_each_row_under_its_first_reason():
    rows = [{"prompt": CASES[c][0], "completion": CASES[c][1]} for c in ("truncated", "code_block", "mixed_language")]
    rows += [{"prompt": EN_PROMPT, "completion": GOOD}] * 2
    # truncated AND holding a code fence: counted once, as truncated
    rows.append({"prompt": EN_PROMPT, "completion": "<think>```x```"})
    kept, counts = filter_readable(rows, ReadabilityConfig())
    assert [r["completion"] for r in kept] == [GOOD, GOOD]
    assert counts == {"truncated": 2, "overlong": 0, "code_block": 1, "long_paragraph": 0, "mixed_language": 1}
    assert set(counts) == set(FILTERS) and len(kept) + sum(counts.values()) == len(rows)


def test_max_tokens_counts_tokens_with_the_tokenizer():
    from grpo_core.models.tiny import build_tiny_tokenizer

    tokenizer = build_tiny_tokenizer()  # one token per byte, <think> and </think> one token each
    config = ReadabilityConfig(max_tokens=len(GOOD) - len("<think></think>") + 2)
    kept, counts = filter_readable([{"prompt": EN_PROMPT, "completion": GOOD},
                                    {"prompt": EN_PROMPT, "completion": GOOD + "!"}], config, tokenizer)
    assert len(kept) == 1 and counts["overlong"] == 1
    with pytest.raises(ValueError, match="tokenizer"):
        filter_readable([{"prompt": EN_PROMPT, "completion": GOOD}], config)
