"""Rejection sampling (R1 stage 3): sample n completions per prompt, keep correct, readable ones.

For each prompt the RL model samples ``n`` completions; a completion is kept when, in this order,
it is correct (the reward scores >= ``reward_threshold``), it stopped on EOS (not truncated), it has the
``<think>...</think><answer>...</answer>`` format, it is no longer than ``max_completion_tokens``, its
language_consistency reward is at least ``language_consistency_threshold`` (R1 filters out mixed-language
chains of thought), and it is not an exact duplicate of a completion already kept for that prompt.
At most ``keep_per_prompt`` survive per prompt, in sample order (seeded, so the choice is deterministic).

The per-prompt pass rate (correct / n, before the other filters) is recorded for every prompt: it is
the difficulty signal R1's data curation uses and the table a user looks at to see what the RL model
can and cannot solve. Departure from R1: no LLM judge for non-verifiable data and no general-data mix
here; the consolidation stage mixes other SFT rows in if configured.
"""

from __future__ import annotations

from collections import Counter
from typing import Any, Callable

from grpo_core.config import RejectionSamplingConfig
from grpo_core.evaluation import _generate, completion_length, has_reasoning_format, sample_seed
from grpo_core.generation import GenerationBackend
from grpo_core.rewards import REWARD_FUNCS, get_reward_funcs
from grpo_core.trainer.prompts import encode_prompt

REJECT_REASONS = ("incorrect", "truncated", "format", "too_long", "language", "duplicate", "over_limit")


def rejection_sample(
    backend: GenerationBackend,
    tokenizer: Any,
    rows: list[dict[str, Any]],
    *,
    n: int = 4,
    keep_per_prompt: int = 1,
    reward_func: str | Callable[..., list[float | None]] = "chain_accuracy",
    reward_threshold: float = 1.0,
    temperature: float = 1.0,
    top_p: float = 1.0,
    max_new_tokens: int = 64,
    require_format: bool = True,
    max_completion_tokens: int | None = None,
    language_consistency_threshold: float | None = None,
    drop_truncated: bool = True,
    seed: int = 0,
    batch_size: int = 64,
) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """``(sft_rows, stats)``: SFT rows ``{prompt, completion, id}`` and the filter statistics.

    ``stats`` has ``rs/num_prompts``, ``rs/num_samples``, ``rs/num_kept``, ``rs/mean_pass_rate``,
    ``rs/prompts_with_kept`` and ``rs/rejected/{reason}`` counts, and ``per_prompt``: one
    ``{"id", "pass_rate", "kept"}`` per prompt.
    """
    if n < 1 or keep_per_prompt < 1:
        raise ValueError(f"n ({n}) and keep_per_prompt ({keep_per_prompt}) must be >= 1")
    if not rows:
        raise ValueError("rejection_sample got no prompt rows")
    fn = get_reward_funcs([reward_func])[0] if isinstance(reward_func, str) else reward_func
    lang_fn = None
    if language_consistency_threshold is not None:
        if "language_consistency" not in REWARD_FUNCS:
            raise KeyError("language_consistency_threshold is set but no 'language_consistency' reward is "
                           "registered; import grpo_core.rewards or unset the threshold")
        lang_fn = REWARD_FUNCS["language_consistency"]

    prompt_ids = [encode_prompt(tokenizer, r["prompt"]) for r in rows]
    seeds = [sample_seed(seed, str(r.get("id", i)), j) for i, r in enumerate(rows) for j in range(n)]
    rollouts = _generate(backend, prompt_ids, n=n, max_tokens=max_new_tokens, greedy=False,
                         batch=max(1, batch_size // n), temperature=temperature, top_p=top_p, seeds=seeds)
    prompts = [row["prompt"] for row in rows for _ in range(n)]
    scores = fn([r.text for r in rollouts], prompts=prompts,
                completion_ids=[r.completion_ids for r in rollouts], max_completion_length=max_new_tokens,
                **_columns(rows, n))
    correct = [s is not None and s >= reward_threshold - 1e-9 for s in scores]
    lang = (lang_fn([r.text for r in rollouts], prompts=prompts)
            if lang_fn is not None else [None] * len(rollouts))

    rejected: Counter[str] = Counter()
    kept_rows: list[dict[str, Any]] = []
    per_prompt = []
    for i, row in enumerate(rows):
        kept_texts: list[str] = []
        for j in range(n):
            k = i * n + j
            r = rollouts[k]
            reason = None
            if not correct[k]:
                reason = "incorrect"
            elif drop_truncated and r.truncated:
                reason = "truncated"
            elif require_format and not has_reasoning_format(r.text):
                reason = "format"
            elif max_completion_tokens is not None and completion_length(r) > max_completion_tokens:
                reason = "too_long"
            elif lang[k] is not None and language_consistency_threshold is not None \
                    and lang[k] < language_consistency_threshold:
                reason = "language"
            elif r.text in kept_texts:
                reason = "duplicate"
            elif len(kept_texts) >= keep_per_prompt:
                reason = "over_limit"
            if reason:
                rejected[reason] += 1
            else:
                kept_texts.append(r.text)
        kept_rows += [{"prompt": row["prompt"], "completion": t, "id": f"{row.get('id', i)}-rs{m}"}
                      for m, t in enumerate(kept_texts)]
        per_prompt.append({"id": row.get("id", str(i)), "pass_rate": sum(correct[i * n:(i + 1) * n]) / n,
                           "kept": len(kept_texts)})

    stats: dict[str, Any] = {
        "rs/num_prompts": len(rows),
        "rs/num_samples": len(rollouts),
        "rs/num_kept": len(kept_rows),
        "rs/mean_pass_rate": sum(p["pass_rate"] for p in per_prompt) / len(per_prompt),
        "rs/prompts_with_kept": sum(p["kept"] > 0 for p in per_prompt),
        "rs/mean_kept_length": (sum(len(tokenizer(r["completion"], add_special_tokens=False)["input_ids"])
                                    for r in kept_rows) / len(kept_rows)) if kept_rows else 0.0,
        **{f"rs/rejected/{reason}": rejected.get(reason, 0) for reason in REJECT_REASONS},
        "per_prompt": per_prompt,
    }
    return kept_rows, stats


def rejection_sample_with_config(config: RejectionSamplingConfig, backend: GenerationBackend, tokenizer: Any,
                                 rows: list[dict[str, Any]], *, batch_size: int = 64
                                 ) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """``rejection_sample`` with the fields of a RejectionSamplingConfig (the stage's entry point)."""
    rows = rows[: config.max_prompts] if config.max_prompts else rows
    return rejection_sample(
        backend, tokenizer, rows, n=config.num_samples, keep_per_prompt=config.keep_per_prompt,
        reward_func=config.reward_func, reward_threshold=config.reward_threshold, temperature=config.temperature,
        top_p=config.top_p, max_new_tokens=config.max_new_tokens, require_format=config.require_format,
        max_completion_tokens=config.max_completion_tokens,
        language_consistency_threshold=config.language_consistency_threshold,
        drop_truncated=config.drop_truncated, seed=config.seed, batch_size=batch_size,
    )


def _columns(rows: list[dict[str, Any]], n: int) -> dict[str, list[Any]]:
    keys = [k for k in rows[0] if k != "prompt"]
    return {k: [row.get(k) for row in rows for _ in range(n)] for k in keys}
