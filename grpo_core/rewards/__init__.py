"""Verifiable rewards (RLVR) under TRL's contract: ``reward(completions, **columns) -> list[float | None]``.

Built-in functions are listed by name in ``base.BUILTIN_REWARDS`` (imported on first use); configs refer to them as ``reward_funcs: [name, ...]``, and to
reward models and generative judges as ``{reward_model: {model: ...}}`` / ``{judge: {model: ...}}`` entries
(``rewards.reward_model``, ``rewards.judge``; loaded by ``scoring.resolve_reward``).
``grpo_core.rewards.scoring.score_completions`` is the one place they are called (training, evaluation and
rejection sampling alike).
"""

from grpo_core.rewards.base import (
    BUILTIN_REWARDS,
    REWARD_FUNCS,
    RewardFunc,
    completion_text,
    count_reward_event,
    get_reward_funcs,
    is_conversational,
    last_user_text,
    pop_reward_stats,
    prompt_text,
    register_reward,
    reward_names,
)

__all__ = [
    "BUILTIN_REWARDS",
    "REWARD_FUNCS",
    "RewardFunc",
    "completion_text",
    "count_reward_event",
    "get_reward_funcs",
    "is_conversational",
    "last_user_text",
    "pop_reward_stats",
    "prompt_text",
    "register_reward",
    "reward_names",
]
# The rewards package's own functions, importable from here (registered by name in base.BUILTIN_REWARDS).
from grpo_core.rewards.code import code_execution  # noqa: E402,F401
from grpo_core.rewards.format import format_reward  # noqa: E402,F401
from grpo_core.rewards.math import math_accuracy  # noqa: E402,F401
from grpo_core.rewards.shaping import language_consistency, overlong_penalty  # noqa: E402,F401
