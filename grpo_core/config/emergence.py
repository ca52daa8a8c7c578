"""The emergence features' phrase lists (reflection, backtracking), read by evaluation and by GRPO's logs."""

from __future__ import annotations

from pydantic import Field

from grpo_core.config.base import _Strict


# The emergence features' default phrase lists (grpo_core.evaluation.emergence matches them).
# Self-verification and reconsideration (the seed's "Wait, let me reconsider..."), English and Chinese.
REFLECTION_PHRASES: tuple[str, ...] = (
    "wait", "let me check", "let's check", "let us check", "let me verify", "verify", "double-check", "double check",
    "check again",
    "recheck", "re-check", "reconsider", "re-evaluate", "re-examine", "let me make sure", "aha",
    "等等", "等一下", "验证", "检查", "重新考虑", "再想想", "核对",
)
# Abandoning a line of reasoning for another.
BACKTRACK_PHRASES: tuple[str, ...] = (
    "actually", "that's wrong", "that is wrong", "this is wrong", "that's incorrect", "that is incorrect",
    "this is incorrect", "that's not right", "that was wrong", "i made a mistake",
    "my mistake", "let me redo", "let me try again", "let me start over", "scratch that", "instead",
    "不对", "错了", "重新计算", "重新来", "其实",
)


class EmergenceConfig(_Strict):
    """The phrase lists of the emergence features (``grpo_core.evaluation.emergence``), for evaluation and GRPO's logs.

    Matching: case-insensitive; a phrase with a CJK character anywhere, any other as whole words."""

    reflection_phrases: list[str] = Field(
        default_factory=lambda: list(REFLECTION_PHRASES),
        description="self-verification/reconsideration phrases (reflection rate); default English + Chinese, "
        "grpo_core.config.REFLECTION_PHRASES")
    backtrack_phrases: list[str] = Field(
        default_factory=lambda: list(BACKTRACK_PHRASES),
        description="phrases that abandon a line of reasoning (backtracking rate); default "
        "grpo_core.config.BACKTRACK_PHRASES")
