"""Held-out evaluation during RL (GRPO's ``eval_steps``): the policy on a fixed held-out slice, every N steps.

The metrics are ``heldout.evaluate_verifiable``'s (what the ``evaluate`` stage reports after a stage), on the
same slice each time: ``eval/accuracy`` (greedy), ``eval/pass@1`` (``sampling.num_generations`` samples per
prompt, seeded by row and sample index, so every evaluation draws the same seeds), the emergence features
(``eval/reflection_rate``, ``eval/mean_steps``, ...) with, on a task with tries (countdown), whether reflection is
checking that pays (``eval/{source}/checking_rate``, ...: ``evaluation/checking.py``), lengths and the format
rate; with the ``evaluate`` section's ``sampling.tools``, multi-turn completions and ``eval/tools/...``. Departures
from the stage evaluation, for cost: no forced-reasoning pass, verifiable rows only (general sources need a reward
model's forward), the GRPO stage's own prompt/completion lengths, and generation on the trainer's sampler (its
weights are the policy's at that step). ``time/eval`` is the seconds it took.

Exact resume: evaluation must not change what training computes next, so the Python, NumPy, torch (and CUDA)
RNG states are saved before and restored after, and the reward functions' event counters of the training step
are kept apart (the evaluation's own are ``eval/rewards/...``). The reward-hacking monitor and checkpoint
selection read the dict ``evaluate_during_rl`` returns.
"""

from __future__ import annotations

import contextlib
import time
from typing import Any, Iterator

from grpo_core.config import EvalConfig, GRPOConfig
from grpo_core.evaluation.heldout import evaluate_verifiable
from grpo_core.generation import GenerationBackend
from grpo_core.rewards import pop_reward_stats
from grpo_core.rewards.base import count_reward_event
from grpo_core.trainer.checkpoint import rng_state, set_rng_state


def rl_eval_config(config: GRPOConfig, base: EvalConfig | None = None) -> EvalConfig:
    """The evaluation ``config.eval_steps`` runs: ``base`` (the pipeline's ``evaluate`` section: reward, sample
    count, temperature, phrase lists, seed; default ``EvalConfig`` scored by the stage's first named reward) with
    the GRPO stage's prompt/completion lengths, no forced reasoning and no general sources. Its ``sampling.tools``
    (multi-turn evaluation) stay: the trainer's sampler (transformers or vLLM) samples the trajectories."""
    if base is None:
        entries = config.sources[0].reward_funcs if config.sources else config.reward_funcs
        named = [e for e in entries if isinstance(e, str)]
        if not named:
            raise ValueError("eval_steps needs a verifiable reward to score the held-out slice: pass eval_config "
                             "(an EvalConfig with reward_func) or name a registered reward first in reward_funcs")
        base = EvalConfig(reward_func=named[0], emergence=config.emergence, seed=config.seed)
    g = config.sampling
    sampling = base.sampling.model_copy(update={"max_prompt_length": g.max_prompt_length, "long_prompts":
                                                g.long_prompts, "max_completion_length": g.max_completion_length})
    return base.model_copy(update={"sampling": sampling, "forced_reasoning": False, "general_sources": [],
                                   "rm_reward": None, "rule_reward": None, "benchmarks": [], "max_rows": None})


def heldout_slice(rows: list[dict[str, Any]], eval_samples: int, general_sources: list[str] = ()) -> list[dict[str, Any]]:
    """The fixed slice: the first ``eval_samples`` rows whose source is not a general one."""
    kept = [r for r in rows if r.get("source") not in set(general_sources)]
    if not kept:
        raise ValueError("eval_steps: the held-out rows hold no verifiable row (every row is a general source); "
                         "give held-out rows with answers or remove eval_steps")
    return kept[:eval_samples]


@contextlib.contextmanager
def preserved_rng() -> Iterator[None]:
    """Run the body without moving any RNG training draws from (restored afterwards, as a checkpoint would)."""

    state = rng_state()
    try:
        yield
    finally:
        set_rng_state(state)


@contextlib.contextmanager
def reward_events_aside() -> Iterator[dict[str, float]]:
    """The reward-event counts made inside the block go into the dict it yields; the counts from before it (the
    training step's so far) are back where the step's log reads them afterwards."""
    held = pop_reward_stats()
    inside: dict[str, float] = {}
    try:
        yield inside
    finally:
        inside.update(pop_reward_stats())
        for key, n in held.items():
            name, event = key.removeprefix("rewards/").rsplit("/", 1)
            count_reward_event(name, event, int(n))


def evaluate_during_rl(config: EvalConfig, backend: GenerationBackend, tokenizer: Any,
                       rows: list[dict[str, Any]]) -> dict[str, float]:
    """``eval/...`` metrics of the policy ``backend`` samples from, on ``rows`` (the fixed slice), plus
    ``time/eval``; no RNG moved, the training step's reward-event counters untouched (module docstring)."""
    start = time.perf_counter()
    with reward_events_aside() as events, preserved_rng():
        result = evaluate_verifiable(config, None, tokenizer, backend, rows, config.reward_func, False)
    metrics = {k: float(v) for k, v in result.items() if isinstance(v, (int, float)) and not isinstance(v, bool)}
    metrics.update({f"eval/{k}": v for k, v in events.items()})
    metrics["time/eval"] = time.perf_counter() - start
    return metrics
