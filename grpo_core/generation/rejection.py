"""Rejection sampling (R1 stage 3): sample n completions per prompt, keep correct, readable ones.

For each prompt the RL model samples ``n`` completions; a completion is kept when, in this order,
it is correct (the reward passes ``reward_threshold``), it stopped on EOS (not truncated), the registered
``format`` reward passes it (``<think>`` non-empty reasoning ``</think>`` + answer: the format training
optimises and evaluation's ``eval/format_rate`` counts; a direct answer with an empty think block fails), it is
no longer than ``max_completion_tokens``, its language_consistency reward passes
``language_consistency_threshold`` (R1 filters out mixed-language chains of thought; a prompt the reward does
not apply to passes), it passes the ``readability`` filters when set (``grpo_core.data.readability``: truncated,
overlong in tokens, code blocks, long paragraphs, mixed CJK/Latin; counted under each filter's name), and it is not an exact duplicate of a completion already kept for that prompt.
The rewards (correctness, plus format and language consistency when those filters are on) are scored in one
``score_completions`` call, the one the trainer makes, and judged by ``passes``, as evaluation judges them.
At most ``keep_per_prompt`` survive per prompt, in sample order (seeded, so the choice is deterministic).

Generation: vLLM gets every prompt in one call and schedules them itself; the transformers sampler gets
``batch_size`` sequences per call (``evaluation._generate``).

Prompts longer than ``max_prompt_length`` are truncated or dropped by ``long_prompts``
(``trainer.prompts.encode_prompts``, the call training and evaluation make), counted in
``rs/prompts_truncated`` and ``rs/prompts_dropped``; a dropped prompt is not sampled and has no ``per_prompt`` entry.

The per-prompt pass rate (correct / n, before the other filters) is recorded for every prompt: it is
the difficulty signal R1's data curation uses and the table a user looks at to see what the RL model
can and cannot solve. Every source (``sources``, ``rejection_sample_with_config``) has its own rule: verifiable
sources keep correct samples; non-verifiable ones (general, safety) keep samples a reward model or judge scores at
least ``min_score``, best first. The consolidation stage mixes general SFT rows in if configured.
"""

from __future__ import annotations

import math
from collections import Counter
from typing import Any

from grpo_core.config import ReadabilityConfig, RejectionSamplingConfig
from grpo_core.evaluation.heldout import _generate, completion_length, sample_seed
from grpo_core.generation import GenerationBackend
from grpo_core.data.readability import FILTERS, readability_reason
from grpo_core.rewards import get_reward_funcs
from grpo_core.rewards.base import RewardFunc
from grpo_core.rewards.scoring import passes, resolve_reward, score_completions
from grpo_core.trainer.prompts import LongPrompts, all_dropped_error, encode_prompts

REJECT_REASONS = ("incorrect", "truncated", "format", "too_long", "language", "duplicate", "over_limit")


def rejection_sample(
    backend: GenerationBackend,
    tokenizer: Any,
    rows: list[dict[str, Any]],
    *,
    n: int = 4,
    keep_per_prompt: int = 1,
    reward_func: str | RewardFunc = "chain_accuracy",
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
    max_prompt_length: int | None = 512,
    long_prompts: LongPrompts = "truncate",
    readability: ReadabilityConfig | None = None,
    min_score: float | None = None,
) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """``(sft_rows, stats)``: SFT rows ``{prompt, completion, id}`` and the filter statistics.

    ``min_score`` (a non-verifiable source scored by a reward model or judge): a sample passes when its
    ``reward_func`` score is at least ``min_score`` (instead of ``reward_threshold``), and a prompt's samples are
    taken best score first, so the ``keep_per_prompt`` kept are its best ones that pass every filter.

    ``stats`` has ``rs/num_prompts``, ``rs/num_samples``, ``rs/num_kept``, ``rs/mean_pass_rate``,
    ``rs/prompts_with_kept``, ``rs/prompts_truncated``, ``rs/prompts_dropped`` and ``rs/rejected/{reason}``
    counts, and ``per_prompt``: one ``{"id", "pass_rate", "kept"}`` per prompt sampled.
    """
    if n < 1 or keep_per_prompt < 1:
        raise ValueError(f"n ({n}) and keep_per_prompt ({keep_per_prompt}) must be >= 1")
    if not rows:
        raise ValueError("rejection_sample got no prompt rows")
    fn, name = resolve_reward(reward_func)
    funcs, names = [fn], [name]
    if require_format:
        funcs, names = funcs + get_reward_funcs(["format"]), names + ["format"]
    if language_consistency_threshold is not None:
        funcs, names = funcs + get_reward_funcs(["language_consistency"]), names + ["language_consistency"]

    encoded = encode_prompts(tokenizer, [r["prompt"] for r in rows], max_prompt_length, long_prompts)
    if not encoded.kept:
        raise all_dropped_error("rejection_sample", len(rows), max_prompt_length)
    row_ids = [str(rows[i].get("id", i)) for i in encoded.kept]  # ids and seeds keep the row's original index
    rows, prompt_ids = [rows[i] for i in encoded.kept], encoded.ids
    seeds = [sample_seed(seed, row_id, j) for row_id in row_ids for j in range(n)]
    rollouts = _generate(backend, prompt_ids, n=n, max_tokens=max_new_tokens, greedy=False,
                         batch=max(1, batch_size // n), temperature=temperature, top_p=top_p, seeds=seeds)
    scores = score_completions(funcs, names, rows, rollouts, n, max_new_tokens)  # [N*n, R]
    correct = passes(scores[:, 0], reward_threshold if min_score is None else min_score)
    score = [-math.inf if math.isnan(v) else v for v in scores[:, 0].tolist()]
    formatted = passes(scores[:, 1]) if require_format else [True] * len(rollouts)
    if language_consistency_threshold is not None:
        lang = scores[:, -1]  # [N*n] NaN where the prompt has no words to detect a language from
        lang_ok = [math.isnan(s) or ok for s, ok in zip(lang.tolist(), passes(lang, language_consistency_threshold))]
    else:
        lang_ok = [True] * len(rollouts)

    rejected: Counter[str] = Counter()
    kept_rows: list[dict[str, Any]] = []
    per_prompt = []
    for i, row in enumerate(rows):
        kept_texts: list[str] = []
        order = range(n) if min_score is None else sorted(range(n), key=lambda j: -score[i * n + j])  # stable
        for j in order:
            k = i * n + j
            r = rollouts[k]
            reason = None
            if not correct[k]:
                reason = "incorrect"
            elif drop_truncated and r.truncated:
                reason = "truncated"
            elif not formatted[k]:
                reason = "format"
            elif max_completion_tokens is not None and completion_length(r) > max_completion_tokens:
                reason = "too_long"
            elif not lang_ok[k]:
                reason = "language"
            elif readability is not None and (why := readability_reason(r.text, row["prompt"], readability,
                                                                          completion_length(r))):
                reason = why.split(":", 1)[0]  # a readability filter's name (grpo_core.data.readability.FILTERS)
            elif r.text in kept_texts:
                reason = "duplicate"
            elif len(kept_texts) >= keep_per_prompt:
                reason = "over_limit"
            if reason:
                rejected[reason] += 1
            else:
                kept_texts.append(r.text)
        kept_rows += [{"prompt": row["prompt"], "completion": t, "id": f"{row_ids[i]}-rs{m}"}
                      for m, t in enumerate(kept_texts)]
        per_prompt.append({"id": row.get("id", row_ids[i]), "pass_rate": sum(correct[i * n:(i + 1) * n]) / n,
                           "kept": len(kept_texts)})

    stats: dict[str, Any] = {
        "rs/num_prompts": len(rows),
        "rs/num_samples": len(rollouts),
        "rs/num_kept": len(kept_rows),
        "rs/mean_pass_rate": sum(p["pass_rate"] for p in per_prompt) / len(per_prompt),
        "rs/prompts_with_kept": sum(p["kept"] > 0 for p in per_prompt),
        **encoded.counts("rs/prompts_"),
        "rs/mean_kept_length": (sum(len(tokenizer(r["completion"], add_special_tokens=False)["input_ids"])
                                    for r in kept_rows) / len(kept_rows)) if kept_rows else 0.0,
        **{f"rs/rejected/{reason}": rejected.get(reason, 0)
           for reason in REJECT_REASONS + (FILTERS if readability is not None else ())},
        "per_prompt": per_prompt,
    }
    return kept_rows, stats


def rejection_sample_with_config(config: RejectionSamplingConfig, backend: GenerationBackend, tokenizer: Any,
                                 rows: list[dict[str, Any]], *, batch_size: int = 64
                                 ) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """``rejection_sample`` with the fields of a RejectionSamplingConfig (the stage's entry point).

    With ``config.sources`` each listed source's rows (the first ``max_prompts`` of each) are sampled and kept by that source's rule (one
    ``rejection_sample`` call per source); rows of other sources are not sampled (``rs/prompts_unlisted``). The
    stats are the totals plus ``rs/{source}/{metric}`` per source; kept rows carry their ``source``."""
    common = dict(n=config.num_samples, temperature=config.temperature, top_p=config.top_p,
                  max_new_tokens=config.max_new_tokens, max_completion_tokens=config.max_completion_tokens,
                  language_consistency_threshold=config.language_consistency_threshold,
                  drop_truncated=config.drop_truncated, seed=config.seed, batch_size=batch_size,
                  max_prompt_length=config.max_prompt_length, long_prompts=config.long_prompts,
                  readability=config.readability)
    if not config.sources:
        rows = rows[: config.max_prompts] if config.max_prompts else rows
        return rejection_sample(backend, tokenizer, rows, keep_per_prompt=config.keep_per_prompt,
                                reward_func=config.reward_func, reward_threshold=config.reward_threshold,
                                require_format=config.require_format, **common)
    rows = [{**r, "id": r.get("id", i)} for i, r in enumerate(rows)]  # ids (and so seeds) unique across sources
    present = sorted({str(r.get("source")) for r in rows})
    kept_all: list[dict[str, Any]] = []
    per_source: dict[str, dict[str, Any]] = {}
    for rule in config.sources:
        subset = [r for r in rows if r.get("source") == rule.name][: config.max_prompts]  # first N of each source
        if not subset:
            raise ValueError(f"rejection_sample.sources names {rule.name!r} but no training row has that source "
                             f"(sources present: {present}); fix the name or remove the rule")
        kept, stats = rejection_sample(
            backend, tokenizer, subset, reward_func=rule.reward_func, min_score=rule.min_score,
            reward_threshold=config.reward_threshold if rule.reward_threshold is None else rule.reward_threshold,
            keep_per_prompt=rule.keep_per_prompt or config.keep_per_prompt,
            require_format=config.require_format if rule.require_format is None else rule.require_format, **common)
        kept_all += [{**r, "source": rule.name} for r in kept]
        per_source[rule.name] = stats
    return kept_all, _merge_stats(per_source, unlisted=sum(r.get("source") not in per_source for r in rows))


def _merge_stats(per_source: dict[str, dict[str, Any]], *, unlisted: int) -> dict[str, Any]:
    """Totals over the sources (means weighted by prompts / kept rows) and each source's under ``rs/{source}/``."""
    parts = list(per_source.values())
    per_prompt = [{**p, "source": name} for name, st in per_source.items() for p in st["per_prompt"]]
    num_kept = sum(st["rs/num_kept"] for st in parts)
    out: dict[str, Any] = {key: sum(st[key] for st in parts) for key in parts[0]
                           if key not in ("per_prompt", "rs/mean_pass_rate", "rs/mean_kept_length")}
    out["rs/mean_pass_rate"] = sum(p["pass_rate"] for p in per_prompt) / len(per_prompt) if per_prompt else 0.0
    out["rs/mean_kept_length"] = (sum(st["rs/mean_kept_length"] * st["rs/num_kept"] for st in parts) / num_kept
                                  if num_kept else 0.0)
    out["rs/prompts_unlisted"] = unlisted
    for name, st in per_source.items():
        out.update({f"rs/{name}/{key[len('rs/'):]}": value for key, value in st.items() if key != "per_prompt"})
    out["per_prompt"] = per_prompt
    return out
