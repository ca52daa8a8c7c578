"""The one place reward functions are called: training, evaluation and rejection sampling score through here.

``score_completions`` is TRL's ``_calculate_rewards``: every reward function gets, one entry per completion,
``prompts``, ``completions`` (``[{"role": "assistant", "content": text}]`` when the prompt is chat messages,
else the text), ``completion_ids``, ``max_completion_length`` and every other dataset column as a keyword.
A ``None`` score (the reward does not apply to that row) becomes NaN, as in TRL.

``passes`` is the one definition of "correct" (evaluation's accuracy and format rate, rejection sampling's
filters): a score at or above a threshold, less a float tolerance; NaN never passes.
"""

from __future__ import annotations

import math
from typing import Any, Protocol, Sequence

import torch
from pydantic import TypeAdapter

from grpo_core.config import JudgeSpec, RewardModelSpec, RewardSpec, normalize_reward_entry
from grpo_core.rewards.base import RewardFunc, get_reward_funcs, is_conversational
from grpo_core.rewards.ensemble import RewardModelEnsemble
from grpo_core.rewards.judge import JudgeReward
from grpo_core.rewards.reward_model import RewardModelReward, moments_of
from grpo_core.rewards.served import served_reward

PASS_THRESHOLD = 1.0  # a verifiable reward scores 1.0 for a correct completion
PASS_TOLERANCE = 1e-6  # so a reward that computes 1.0 as 0.9999999 still passes
NOT_COLUMNS = ("prompt", "completion", "completion_ids")  # row keys not passed as dataset columns (as TRL)


class ScoredCompletion(Protocol):
    """What scoring reads of a rollout (``grpo_core.generation.Rollout`` has both)."""

    text: str
    completion_ids: list[int]


def resolve_reward(reward: Any) -> tuple[RewardFunc, str]:
    """``(function, name)`` of a ``reward_funcs`` entry: a registered name, a reward model or judge (a
    ``RewardModelSpec`` / ``JudgeSpec``, or its YAML mapping ``{reward_model: {model: ...}}``, loaded here or, with
    ``url``, a client of its server), or a callable (named by its ``__name__``).

    Args:
        reward: a registered name (``"math_accuracy"``), a ``RewardModelSpec`` / ``JudgeSpec`` or its mapping, or
            a callable under the ``RewardFunc`` contract.

    Returns:
        ``(function, name)``: the function to call, and its metric name (the registered name, the spec's
            ``name``, or the callable's ``__name__``). A reward model with ``ensemble`` is a
            ``RewardModelEnsemble``.

    Raises:
        KeyError: an unregistered name (``get_reward_funcs``).
        ValueError: a mapping that is not a valid reward model or judge entry (pydantic's ``ValidationError``
            is a ``ValueError``).
    """
    if isinstance(reward, str):
        return get_reward_funcs([reward])[0], reward
    if isinstance(reward, dict):
        reward = TypeAdapter(RewardSpec).validate_python(normalize_reward_entry(reward))
    if isinstance(reward, (RewardModelSpec, JudgeSpec)) and reward.url is not None:
        return served_reward(reward), reward.name
    if isinstance(reward, RewardModelSpec) and reward.ensemble:
        return RewardModelEnsemble(reward), reward.name
    if isinstance(reward, RewardModelSpec):
        return RewardModelReward(reward), reward.name
    if isinstance(reward, JudgeSpec):
        return JudgeReward(reward), reward.name
    return reward, getattr(reward, "__name__", "reward")


def score_completions(
    reward_funcs: Sequence[RewardFunc],
    reward_names: Sequence[str],
    rows: Sequence[dict[str, Any]],
    rollouts: Sequence[ScoredCompletion],
    num_generations: int,
    max_completion_length: int,
    routes: Sequence[Sequence[int]] | None = None,
) -> torch.Tensor:
    """Score every completion with every reward function: TRL's ``_calculate_rewards``.

    Each function is called once, with keyword arguments holding one entry per completion: ``prompts``,
    ``completions`` (chat form when the prompt is chat messages), ``completion_ids``, ``max_completion_length``
    and every other column of ``rows`` (``answer``, ``tests``, ``source``, ...).

    Args:
        reward_funcs: the functions (``resolve_reward``'s), R of them.
        reward_names: their metric names, one per function (named in errors).
        rows: the prompt rows, each ``{"prompt": ..., **columns}``.
        rollouts: ``len(rows) * num_generations`` completions, each row's G contiguous (anything with ``text``
            and ``completion_ids``, e.g. ``grpo_core.generation.Rollout``).
        num_generations: G, completions per row.
        max_completion_length: passed to every function (``overlong_penalty`` reads it).
        routes: a data mixture by source: for each function the indices of the ``rows`` it scores; it is called on
            those rows' completions only, NaN elsewhere (a function whose running moments are shared across ranks,
            ``reward_model.share_moments``, is called even with none: every rank joins). None: every function
            scores every row.

    Returns:
        ``[B, R]`` float rewards, B = ``len(rows) * num_generations``; NaN where a function returned None or
            did not score that row.

    Raises:
        ValueError: ``rollouts`` is not ``len(rows) * num_generations`` long, or a function returned a number of
            scores other than the completions it was given (naming the function).
    """
    B = len(rows) * num_generations
    if len(rollouts) != B:
        raise ValueError(f"{len(rollouts)} completions for {len(rows)} rows x {num_generations} generations")
    prompts = [row["prompt"] for row in rows for _ in range(num_generations)]
    completions: list[Any] = [
        [{"role": "assistant", "content": r.text}] if is_conversational(p) else r.text
        for p, r in zip(prompts, rollouts)
    ]
    keys = [k for k in dict.fromkeys(k for row in rows for k in row) if k not in NOT_COLUMNS]
    columns = {k: [row.get(k) for row in rows for _ in range(num_generations)] for k in keys}
    completion_ids = [r.completion_ids for r in rollouts]
    out = torch.full((B, len(reward_funcs)), math.nan)  # [B, R]
    for col, (func, name) in enumerate(zip(reward_funcs, reward_names, strict=True)):
        if routes is None:
            seqs = list(range(B))
        else:  # this function's rows only, each row's G completions
            seqs = [r * num_generations + j for r in routes[col] for j in range(num_generations)]
            if not seqs and not any(m.across_ranks for m in moments_of(func)):  # else: its update is a collective
                continue
        pick = (lambda values: values) if routes is None else (lambda values: [values[i] for i in seqs])
        scores = func(
            prompts=pick(prompts),
            completions=pick(completions),
            completion_ids=pick(completion_ids),
            max_completion_length=max_completion_length,
            **{k: pick(v) for k, v in columns.items()},
        )
        if len(scores) != len(seqs):
            raise ValueError(f"reward function {name!r} returned {len(scores)} scores for {len(seqs)} completions")
        for i, s in zip(seqs, scores):
            if s is not None:
                out[i, col] = float(s)
    return out


def reward_states(reward_funcs: Sequence[RewardFunc]) -> list[dict[str, Any] | None]:
    """Each function's state to checkpoint: ``state_dict()`` where it has one (a reward model normalising by its
    running moments), None for a stateless one; a resumed run restores it with ``load_reward_states``."""
    return [f.state_dict() if hasattr(f, "state_dict") else None for f in reward_funcs]  # type: ignore[attr-defined]


def load_reward_states(reward_funcs: Sequence[RewardFunc], states: Sequence[dict[str, Any] | None]) -> None:
    """Restore what ``reward_states`` saved, function by function (the same functions in the same order)."""
    if len(states) != len(reward_funcs):
        raise ValueError(f"the checkpoint holds the state of {len(states)} reward functions, this run has "
                         f"{len(reward_funcs)}; resume with the reward functions the run started with")
    for func, state in zip(reward_funcs, states):
        if state is not None and hasattr(func, "load_state_dict"):
            func.load_state_dict(state)  # type: ignore[attr-defined]


def passes(scores: torch.Tensor, threshold: float = PASS_THRESHOLD) -> list[bool]:
    """The one definition of "correct" (evaluation's accuracy and format rate, rejection sampling's filters).

    Args:
        scores: ``[B]`` scores of one reward function (NaN: not scored).
        threshold: the pass mark; 1.0, the score of a correct answer under a verifiable reward.

    Returns:
        Per score, whether it is at least ``threshold`` less ``PASS_TOLERANCE`` (1e-6); NaN never passes.
    """
    return (scores >= threshold - PASS_TOLERANCE).tolist()  # NaN compares False
