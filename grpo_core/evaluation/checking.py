"""Checking measured as checking: on a task with tries (the built-in countdown, ``grpo_core.data.countdown``), whether a
reflection phrase is a check that pays, not a word.

``emergence``'s reflection rate counts a phrase anywhere in the reasoning, so ``<think>wait</think>``, a fixed
template that tries every pair whatever it finds, and a ``wait`` after a try that already reached the target all
count. Here the tries are read from the reasoning (``countdown.try_steps``: a ``;``-separated piece ``x op y=...``,
whether it hits computed from the prompt, not read off the response) with what the reasoning says after each try
up to the next one, and the phrases are matched by ``emergence.has_phrase`` (the reflection rate's own rule).

Per try:

- a missed try is **checked and retried** when what follows it (up to the next try) holds a reflection phrase and
  another try follows. In both teacher styles the check is the ``wait`` after a miss (``3+8=11;wait, 11!=13;8+5=13``
  and ``3+8=11?13;wait;8+5=13?13``); a value written beside the target (``?13``, ``11!=13``) without a phrase is not
  counted, so a try after a miss without one is a blind retry (a retry, not a checked one).
- a try that hits **stops** when no try follows it.

Over a set of responses (``checking_stats``; responses to prompts that are not countdown are left out):

- ``miss_retry_rate``: of the tries that missed, the share checked and retried (a miss the response ends on counts
  against it);
- ``hit_stop_rate``: of the tries that hit, the share after which the response tries nothing more;
- ``first_try_hit_rate``: of the responses with a try, the share whose first try hits; ``retry_hit_rate``: of the
  tries made right after a missed try (``retries`` of them, checked or blind), the share that hit;
- ``checking_rate``: of the responses, the share with at least one miss checked and retried (a binomial rate over
  responses: the training curve's aha rule can read it);
- ``reflection_after_hit_rate``: of the responses, the share with a reflection phrase after a try that hit (a check
  that cannot pay: the answer was found), and ``reflection_without_try_rate``: the share whose reasoning
  (``emergence.reasoning_text``) holds a reflection phrase but which makes no try at all. Both are counted apart.

NaN where there is nothing to count (no countdown response, no miss, no hit, no retry).
"""

from __future__ import annotations

import math
from typing import Any, Sequence

from grpo_core.config import REFLECTION_PHRASES
from grpo_core.data.countdown import try_steps
from grpo_core.evaluation.emergence import has_phrase, reasoning_text
from grpo_core.rewards.base import completion_text

# What the trainer logs per step and the evaluation per source (``completions/{source}/...``, ``eval/{source}/...``).
CHECKING_KEYS = ("checking_rate", "miss_retry_rate", "hit_stop_rate", "first_try_hit_rate", "retry_hit_rate",
                 "reflection_after_hit_rate", "reflection_without_try_rate")


def checking_stats(completions: Sequence[Any], prompts: Sequence[Any],
                   reflection_phrases: Sequence[str] = REFLECTION_PHRASES) -> dict[str, float]:
    """The checking numbers of ``completions`` (one prompt each) by the module docstring's rules: the rates of
    ``CHECKING_KEYS``, ``retries`` (a count), ``responses`` (the countdown responses counted) and
    ``tries_per_response`` (their tries over them, a response with none counting 0)."""
    if len(completions) != len(prompts):
        raise ValueError(f"checking_stats: {len(completions)} completions but {len(prompts)} prompts; give one each")
    misses = checked = hits = stops = 0
    retries: list[bool] = []
    first: list[bool] = []
    responses = checking = after_hit = without_try = tries = 0
    for completion, prompt in zip(completions, prompts):
        steps = try_steps(completion, prompt)
        if steps is None:
            continue
        responses += 1
        tries += len(steps)
        if not steps:
            without_try += has_phrase(reasoning_text(completion_text(completion)), reflection_phrases)
            continue
        first.append(steps[0][0])
        any_checked = hit_seen = reflected_after_hit = False
        for i, (hit, after) in enumerate(steps):
            reflects, more = has_phrase(after, reflection_phrases), i + 1 < len(steps)
            hit_seen = hit_seen or hit
            reflected_after_hit = reflected_after_hit or (hit_seen and reflects)
            if hit:
                hits += 1
                stops += not more
            else:
                misses += 1
                if reflects and more:
                    checked += 1
                    any_checked = True
                if more:
                    retries.append(steps[i + 1][0])
        checking += any_checked
        after_hit += reflected_after_hit
    return {"checking_rate": _share(checking, responses), "miss_retry_rate": _share(checked, misses),
            "hit_stop_rate": _share(stops, hits), "first_try_hit_rate": _share(sum(first), len(first)),
            "retry_hit_rate": _share(sum(retries), len(retries)),
            "reflection_after_hit_rate": _share(after_hit, responses),
            "reflection_without_try_rate": _share(without_try, responses),
            "retries": float(len(retries)), "responses": float(responses),
            "tries_per_response": _share(tries, responses)}


def has_tries(prompts: Sequence[Any]) -> bool:
    """Whether any of ``prompts`` belongs to a task with tries (a countdown prompt), so ``checking_stats`` applies."""
    return any(try_steps("", p) is not None for p in prompts)


def _share(part: float, whole: int) -> float:
    return part / whole if whole else math.nan
