"""The reward contract (TRL's) and the registry that config names resolve through.

The built-in rewards are listed once, in ``BUILTIN_REWARDS`` (name -> ``module:attribute``), and imported on first
use; a user's own are added with ``register_reward``. Importing a reward module registers nothing by itself.

A reward function is ``reward(completions, **dataset_columns) -> list[float | None]``: one score per
completion, ``None`` where the function does not apply to that row (TRL treats it as missing, not 0).
Prompts and completions are plain strings or chat message lists (``[{"role": "assistant", "content": ...}]``);
the helpers at the end read the text out of either form.
"""

from __future__ import annotations

import importlib
import threading
from collections import Counter
from typing import Any, Callable, Protocol


class RewardFunc(Protocol):
    """A reward function under TRL's contract: ``reward(completions, **kwargs) -> list[float | None]``.

    It is called by ``grpo_core.rewards.scoring.score_completions`` (training, evaluation and rejection sampling
    alike) with keyword arguments, one entry per completion: ``prompts``, ``completions`` (the text, or
    ``[{"role": "assistant", "content": text}]`` when the prompt is chat messages), ``completion_ids``,
    ``max_completion_length`` (an int), and every other column of the rows (``answer``, ``tests``, ``source``,
    ...). Accept ``**kwargs`` for the columns you do not read.

    It returns one score per completion, or ``None`` where it does not apply to that row (no ground truth, no
    tests): TRL treats ``None`` as missing, not 0 (NaN in the reward tensor; a weighted sum counts it as 0). A
    verifiable reward scores 1.0 for a correct completion: evaluation's accuracy and rejection sampling keep what
    scores at least 1.0 (``scoring.passes``). Its ``__name__`` is its metric name (``rewards/{name}/mean``) unless
    it is registered under another (``register_reward``).

    Example:
        ```python
        from grpo_core.rewards import completion_text, register_reward

        @register_reward("ends_with_answer")
        def ends_with_answer(completions, answer=None, **kwargs):
            if answer is None:
                return [None] * len(completions)
            return [1.0 if completion_text(c).rstrip().endswith(str(a)) else 0.0
                    for c, a in zip(completions, answer)]
        ```
    """

    __name__: str

    def __call__(self, completions: list[Any], **kwargs: Any) -> list[float | None]: ...


BUILTIN_REWARDS: dict[str, str] = {  # every built-in reward, registered here and nowhere else
    "math_accuracy": "grpo_core.rewards.math:math_accuracy",
    "format": "grpo_core.rewards.format:format_reward",
    "code_execution": "grpo_core.rewards.code:code_execution",
    "overlong_penalty": "grpo_core.rewards.shaping:overlong_penalty",
    "language_consistency": "grpo_core.rewards.shaping:language_consistency",
    "chain_accuracy": "grpo_core.data.synthetic:chain_accuracy",  # the built-in chain task
    "chain_format": "grpo_core.data.synthetic:chain_format",
    "countdown_accuracy": "grpo_core.data.countdown:countdown_accuracy",  # the built-in countdown task
    "calc_accuracy": "grpo_core.data.calc:calc_accuracy",  # the built-in calc task (a calculator call pays)
    "preference_rule": "grpo_core.data.general:preference_rule",  # the built-in general sources' rule
}
"""Every built-in reward by its config name: ``name -> "module:attribute"``, imported the first time a config or
``get_reward_funcs`` looks it up (``REWARD_FUNCS``). A name here cannot be registered again."""


class _Registry(dict):
    """name -> reward function; a built-in is imported the first time it is looked up."""

    def __missing__(self, name: str) -> RewardFunc:
        if name not in BUILTIN_REWARDS:
            raise KeyError(name)
        module, attribute = BUILTIN_REWARDS[name].split(":")
        fn = self[name] = getattr(importlib.import_module(module), attribute)
        return fn


REWARD_FUNCS: dict[str, RewardFunc] = _Registry()


def reward_names() -> list[str]:
    """Every name a config may give in ``reward_funcs``: the built-ins and the ones registered since.

    Returns:
        The names, sorted.
    """
    return sorted(set(BUILTIN_REWARDS) | set(REWARD_FUNCS))


def register_reward(name: str) -> Callable[[RewardFunc], RewardFunc]:
    """Decorator: make the decorated function available to configs as ``reward_funcs: [name]``.

    Register before a pipeline config that names it is loaded: ``PipelineConfig`` checks every reward name against
    ``reward_names()`` at load time (an unknown one fails with its YAML line). Registering the same function under
    the same name twice is a no-op.

    Args:
        name: the config name; also the function's metric name (``rewards/{name}/mean``).

    Returns:
        A decorator that registers the function and returns it unchanged.

    Raises:
        ValueError: ``name`` is a built-in (``BUILTIN_REWARDS``) or already registered to another function.
    """

    def deco(fn: RewardFunc) -> RewardFunc:
        if name in BUILTIN_REWARDS:
            raise ValueError(f"reward {name!r} is built in ({BUILTIN_REWARDS[name]}); register yours under another name")
        if name in REWARD_FUNCS and REWARD_FUNCS[name] is not fn:
            raise ValueError(f"reward {name!r} is already registered to {REWARD_FUNCS[name].__name__}")
        REWARD_FUNCS[name] = fn
        return fn

    return deco


def get_reward_funcs(names: list[str]) -> list[RewardFunc]:
    """Resolve config names to functions (a built-in is imported on first use).

    Args:
        names: registered reward names, e.g. ``["math_accuracy", "format"]``.

    Returns:
        The functions, in the order of ``names``.

    Raises:
        KeyError: a name that is neither built in nor registered; the message lists the names that are.
    """
    missing = [n for n in names if n not in reward_names()]
    if missing:
        raise KeyError(
            f"unknown reward function(s) {missing}; registered: {reward_names()}. "
            "Register your own with grpo_core.rewards.register_reward('name')."
        )
    return [REWARD_FUNCS[n] for n in names]


def is_conversational(prompt: Any) -> bool:
    """Whether a prompt is chat messages (TRL's conversational form) rather than plain text."""
    return isinstance(prompt, list) and all(isinstance(m, dict) and "role" in m for m in prompt)


def prompt_text(prompt: Any) -> str:
    """All message contents of a prompt joined by newlines (or the string itself): what dedupe and
    decontamination compare."""
    if isinstance(prompt, str):
        return prompt
    if isinstance(prompt, (list, tuple)):
        return "\n".join(str(m.get("content") or "") for m in prompt if isinstance(m, dict))
    return str(prompt)


def last_user_text(prompt: Any) -> str:
    """The last user message of a chat prompt (all contents when it has none), or the prompt string:
    the question itself, without a system prompt or earlier turns."""
    if isinstance(prompt, (list, tuple)):
        users = [m for m in prompt if isinstance(m, dict) and m.get("role") == "user"]
        if users:
            return str(users[-1].get("content") or "")
    return prompt_text(prompt)


def completion_text(completion: Any) -> str:
    """The text of one completion: a string as is, a message list as its last assistant content."""
    if isinstance(completion, str):
        return completion
    if isinstance(completion, bytes):
        return completion.decode("utf-8", errors="replace")
    if isinstance(completion, (list, tuple)):
        for msg in reversed(completion):
            if isinstance(msg, dict) and msg.get("role", "assistant") == "assistant":
                return str(msg.get("content") or "")
        return ""
    if isinstance(completion, dict):
        return str(completion.get("content") or "")
    return str(completion)


_STATS: Counter[str] = Counter()
_STATS_LOCK = threading.Lock()


def count_reward_event(reward_name: str, event: str, n: int = 1) -> None:
    """Count an event of a reward function (``timeouts``, ``errors``, ...) for the trainer's metrics."""
    if n:
        with _STATS_LOCK:
            _STATS[f"rewards/{reward_name}/{event}"] += n


def pop_reward_stats() -> dict[str, float]:
    """Counters since the last call, e.g. ``{"rewards/math_accuracy/timeouts": 2.0}``; resets them."""
    with _STATS_LOCK:
        out = {k: float(v) for k, v in _STATS.items()}
        _STATS.clear()
    return out
