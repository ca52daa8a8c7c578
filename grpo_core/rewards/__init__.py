"""Verifiable rewards (RLVR) under TRL's contract: ``reward(completions, **columns) -> list[float | None]``.

Built-in functions register themselves by name; configs refer to them as ``reward_funcs: [name, ...]``.
"""

from grpo_core.rewards.base import REWARD_FUNCS, RewardFunc, completion_text, get_reward_funcs, register_reward

__all__ = ["REWARD_FUNCS", "RewardFunc", "completion_text", "get_reward_funcs", "register_reward"]
