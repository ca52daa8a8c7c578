"""Rejection sampling (R1 stage 3): sample n completions per prompt, keep correct, readable ones.

For each prompt the RL model samples ``n`` (``sampling.num_generations``) completions; a completion is kept when, in this order,
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

Generation (``sampling``, the section's own ``RejectionSampling``: n, temperature, lengths, backend): vLLM gets
every prompt in one call and schedules them itself; the transformers sampler gets ``sampling.batch_size``
sequences per call (``evaluation.heldout.sample``).

With ``sampling.tools`` a sample is a multi-turn trajectory (``evaluation.tool_use.ToolSampler``, the prompts with the
tools' schemas): the model's turns and the tool turns that answer its calls. It passes when its final answer does:
the rewards read the whole text (``calc_accuracy`` never reads a tool turn's content as the answer). The readability
filters read the model's turns only (its own tokens, ``Rollout.tool_mask`` 0: a tool's output is not the model's
chain of thought), their token count too. The kept completion keeps its tool turns in the text (verbatim, as the chat
template wrapped them: ``generation.trajectory.trajectory_text``) and the row the tools' schemas in its ``tools``
column (JSON text, TRL's column name), so consolidation's SFT encodes the prompt with the schemas and the completion
into the tokens that were sampled, the tool turns masked out of the loss (``trainer/sft.py``). The tool use is
counted in ``rs/tools/calls``, ``rs/tools/errors``, ``rs/tools/samples_with_call`` and ``rs/tools/kept_with_call``.

Prompts longer than ``max_prompt_length`` are truncated or dropped by ``long_prompts``
(``generation.prompts.encode_prompts``, the call training and evaluation make), counted in
``rs/prompts_truncated`` and ``rs/prompts_dropped``; a dropped prompt is not sampled and has no ``per_prompt`` entry.

The per-prompt pass rate (correct / n, before the other filters) is recorded for every prompt: it is
the difficulty signal R1's data curation uses and the table a user looks at to see what the RL model
can and cannot solve. Every source (``sources``) has its own rule (``KeepRule``): verifiable
sources keep correct samples; non-verifiable ones (general, safety) keep samples a reward model or judge scores at
least ``min_score``, best first. The consolidation stage mixes general SFT rows in if configured.
"""

from __future__ import annotations

import json
import math
from collections import Counter
from dataclasses import dataclass
from typing import Any

from grpo_core.config import RejectionSamplingConfig, RejectionSource, RewardEntry
from grpo_core.data.readability import FILTERS, readability_reason
from grpo_core.evaluation.heldout import completion_length, sample, sample_seed
from grpo_core.evaluation.tool_use import ToolSampler
from grpo_core.generation.base import GenerationBackend, Rollout
from grpo_core.generation.prompts import EncodedPrompts, all_dropped_error, encode_prompts
from grpo_core.generation.trajectory import TrajectoryStats
from grpo_core.rewards import get_reward_funcs
from grpo_core.rewards.base import RewardFunc
from grpo_core.rewards.scoring import passes, resolve_reward, score_completions

REJECT_REASONS = ("incorrect", "truncated", "format", "too_long", "language", "duplicate", "over_limit")


@dataclass(frozen=True)
class KeepRule:
    """What a sample must pass to be kept: the section's rule, or one source's (``RejectionSource``) with the
    section's values where the source leaves them unset. ``min_score`` (a non-verifiable source scored by a reward
    model or judge): a sample passes when its ``reward_func`` score is at least ``min_score`` (instead of
    ``reward_threshold``), and a prompt's samples are taken best score first."""

    reward_func: RewardEntry | RewardFunc
    reward_threshold: float = 1.0
    min_score: float | None = None
    keep_per_prompt: int = 1
    require_format: bool = True

    @classmethod
    def of(cls, config: RejectionSamplingConfig, source: RejectionSource | None = None) -> "KeepRule":
        if source is None:
            return cls(config.reward_func, config.reward_threshold, None, config.keep_per_prompt,
                       config.require_format)
        return cls(source.reward_func,
                   config.reward_threshold if source.reward_threshold is None else source.reward_threshold,
                   source.min_score, source.keep_per_prompt or config.keep_per_prompt,
                   config.require_format if source.require_format is None else source.require_format)


@dataclass
class _Scored:
    """One rule's samples and their verdicts: ``n`` rollouts per kept prompt, contiguous."""

    rows: list[dict[str, Any]]
    row_ids: list[str]
    encoded: EncodedPrompts
    rollouts: list[Rollout]
    correct: list[bool]
    score: list[float]  # -inf where the reward gave no score
    formatted: list[bool]
    lang_ok: list[bool]
    model_texts: list[str]  # the model's turns (the text, for a sample without tool turns): what readability reads
    model_lengths: list[int]  # their tokens (completion_length, less the tool turns' tokens)
    use: TrajectoryStats | None  # with tools: each sample's tool calls and error turns
    tools_json: str | None  # with tools: their schemas as JSON, the kept rows' ``tools`` column


def rejection_sample(config: RejectionSamplingConfig, backend: GenerationBackend, tokenizer: Any,
                     rows: list[dict[str, Any]], *, reward_func: RewardFunc | None = None
                     ) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """``(sft_rows, stats)`` of the stage: SFT rows ``{prompt, completion, id}`` and the filter statistics.

    Without ``config.sources`` the first ``max_prompts`` rows are sampled and kept by the section's rule
    (``reward_func``, a callable, replaces ``config.reward_func``: a notebook's own reward). With sources each
    listed source's rows (the first ``max_prompts`` of each) are sampled and kept by that source's rule (one
    ``sample_and_filter`` call per source); rows of other sources are not sampled (``rs/prompts_unlisted``). The
    stats are then the totals plus ``rs/{source}/{metric}`` per source; kept rows carry their ``source``."""
    if not config.sources:
        rows = rows[: config.max_prompts] if config.max_prompts else rows
        rule = KeepRule.of(config)
        if reward_func is not None:
            rule = KeepRule(reward_func, rule.reward_threshold, None, rule.keep_per_prompt, rule.require_format)
        return sample_and_filter(config, rule, backend, tokenizer, rows)
    rows = [{**r, "id": r.get("id", i)} for i, r in enumerate(rows)]  # ids (and so seeds) unique across sources
    present = sorted({str(r.get("source")) for r in rows})
    kept_all: list[dict[str, Any]] = []
    per_source: dict[str, dict[str, Any]] = {}
    for source in config.sources:
        subset = [r for r in rows if r.get("source") == source.name][: config.max_prompts]  # first N of each source
        if not subset:
            raise ValueError(f"rejection_sample.sources names {source.name!r} but no training row has that source "
                             f"(sources present: {present}); fix the name or remove the rule")
        kept, stats = sample_and_filter(config, KeepRule.of(config, source), backend, tokenizer, subset)
        kept_all += [{**r, "source": source.name} for r in kept]
        per_source[source.name] = stats
    return kept_all, _merge_stats(per_source, unlisted=sum(r.get("source") not in per_source for r in rows))


def sample_and_filter(config: RejectionSamplingConfig, rule: KeepRule, backend: GenerationBackend, tokenizer: Any,
                      rows: list[dict[str, Any]]) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """``(sft_rows, stats)`` of ``rows`` under one ``rule``: sample, score, then keep per prompt (module docstring).

    ``stats`` has ``rs/num_prompts``, ``rs/num_samples``, ``rs/num_kept``, ``rs/mean_pass_rate``,
    ``rs/prompts_with_kept``, ``rs/prompts_truncated``, ``rs/prompts_dropped`` and ``rs/rejected/{reason}``
    counts, with ``sampling.tools`` the tool-use counts (``rs/tools/calls``, ``rs/tools/errors``,
    ``rs/tools/samples_with_call``, ``rs/tools/kept_with_call``), and ``per_prompt``: one ``{"id", "pass_rate",
    "kept"}`` per prompt sampled."""
    if not rows:
        raise ValueError("rejection_sample got no prompt rows")
    n = config.sampling.num_generations
    scored = _sample_and_score(config, rule, backend, tokenizer, rows)
    rejected: Counter[str] = Counter()
    kept_rows: list[dict[str, Any]] = []
    per_prompt = []
    kept_with_call = 0
    for i, row in enumerate(scored.rows):
        kept_texts: list[str] = []
        order = range(n) if rule.min_score is None else sorted(range(n), key=lambda j: -scored.score[i * n + j])
        for k in (i * n + j for j in order):  # stable: ties keep sample order
            reason = _reject_reason(config, rule, scored, k, row["prompt"], kept_texts)
            if reason:
                rejected[reason] += 1
            else:
                kept_texts.append(scored.rollouts[k].text)
                kept_with_call += scored.use is not None and scored.use.tool_calls[k] > 0
        kept_rows += [{"prompt": row["prompt"], "completion": t, "id": f"{scored.row_ids[i]}-rs{m}",
                       **({"tools": scored.tools_json} if scored.tools_json is not None else {})}
                      for m, t in enumerate(kept_texts)]
        per_prompt.append({"id": row.get("id", scored.row_ids[i]),
                           "pass_rate": sum(scored.correct[i * n:(i + 1) * n]) / n, "kept": len(kept_texts)})
    stats: dict[str, Any] = {
        "rs/num_prompts": len(scored.rows),
        "rs/num_samples": len(scored.rollouts),
        "rs/num_kept": len(kept_rows),
        "rs/mean_pass_rate": sum(p["pass_rate"] for p in per_prompt) / len(per_prompt),
        "rs/prompts_with_kept": sum(p["kept"] > 0 for p in per_prompt),
        **scored.encoded.counts("rs/prompts_"),
        "rs/mean_kept_length": (sum(len(tokenizer(r["completion"], add_special_tokens=False)["input_ids"])
                                    for r in kept_rows) / len(kept_rows)) if kept_rows else 0.0,
        **{f"rs/rejected/{reason}": rejected.get(reason, 0)
           for reason in REJECT_REASONS + (FILTERS if config.readability is not None else ())},
        "per_prompt": per_prompt,
    }
    if scored.use is not None:  # counts, so that the totals over sources add up (_merge_stats)
        stats.update({"rs/tools/calls": sum(scored.use.tool_calls), "rs/tools/errors": sum(scored.use.tool_errors),
                      "rs/tools/samples_with_call": sum(c > 0 for c in scored.use.tool_calls),
                      "rs/tools/kept_with_call": kept_with_call})
    return kept_rows, stats


def _sample_and_score(config: RejectionSamplingConfig, rule: KeepRule, backend: GenerationBackend, tokenizer: Any,
                      rows: list[dict[str, Any]]) -> _Scored:
    """Encode the prompts (long ones by ``long_prompts``), sample ``n`` seeded completions each and score them
    with the rule's reward plus the format and language rewards when those filters are on, in one call."""
    s = config.sampling
    n = s.num_generations
    fn, name = resolve_reward(rule.reward_func)
    funcs, names = [fn], [name]
    if rule.require_format:
        funcs, names = funcs + get_reward_funcs(["format"]), names + ["format"]
    if config.language_consistency_threshold is not None:
        funcs, names = funcs + get_reward_funcs(["language_consistency"]), names + ["language_consistency"]
    tools = ToolSampler.of(s, tokenizer)  # None: single-turn samples
    use = TrajectoryStats() if tools is not None else None
    schemas = tools.schemas() if tools is not None else None
    encoded = encode_prompts(tokenizer, [r["prompt"] for r in rows], s.max_prompt_length, s.long_prompts,
                             tools=schemas)
    if not encoded.kept:
        raise all_dropped_error("rejection_sample", len(rows), s.max_prompt_length)
    row_ids = [str(rows[i].get("id", i)) for i in encoded.kept]  # ids and seeds keep the row's original index
    rows = [rows[i] for i in encoded.kept]
    rollouts = sample(backend, encoded.ids, s, [sample_seed(config.seed, r, j) for r in row_ids for j in range(n)],
                      tools=tools, stats=use)
    scores = score_completions(funcs, names, rows, rollouts, n, s.max_completion_length)  # [N*n, R]
    correct = passes(scores[:, 0], rule.reward_threshold if rule.min_score is None else rule.min_score)
    formatted = passes(scores[:, 1]) if rule.require_format else [True] * len(rollouts)
    lang_ok = [True] * len(rollouts)
    if config.language_consistency_threshold is not None:
        lang = scores[:, -1]  # [N*n] NaN where the prompt has no words to detect a language from
        lang_ok = [math.isnan(v) or ok for v, ok in zip(lang.tolist(),
                                                         passes(lang, config.language_consistency_threshold))]
    score = [-math.inf if math.isnan(v) else v for v in scores[:, 0].tolist()]
    model_texts = [model_turns_text(r, tokenizer) for r in rollouts]
    model_lengths = [completion_length(r) - sum(r.tool_mask or []) for r in rollouts]
    return _Scored(rows, row_ids, encoded, rollouts, correct, score, formatted, lang_ok, model_texts, model_lengths,
                   use, json.dumps(schemas) if schemas is not None else None)


def model_turns_text(rollout: Rollout, tokenizer: Any) -> str:
    """The model's turns of a sample: its own tokens decoded (the tool turns' left out, whatever the chat template
    wraps them in); the text itself for a sample without tool turns."""
    if not any(rollout.tool_mask or []):
        return rollout.text
    own = [t for t, tool in zip(rollout.completion_ids, rollout.tool_mask or []) if not tool]
    return tokenizer.decode(own, skip_special_tokens=True)


def _reject_reason(config: RejectionSamplingConfig, rule: KeepRule, scored: _Scored, k: int, prompt: Any,
                   kept_texts: list[str]) -> str | None:
    """Why sample ``k`` is not kept (the first filter it fails, in the module docstring's order), or None."""
    r = scored.rollouts[k]
    if not scored.correct[k]:
        return "incorrect"
    if config.drop_truncated and r.truncated:
        return "truncated"
    if not scored.formatted[k]:
        return "format"
    if config.max_completion_tokens is not None and completion_length(r) > config.max_completion_tokens:
        return "too_long"
    if not scored.lang_ok[k]:
        return "language"
    if config.readability is not None and (why := readability_reason(scored.model_texts[k], prompt, config.readability,
                                                                     scored.model_lengths[k])):
        return why.split(":", 1)[0]  # a readability filter's name (grpo_core.data.readability.FILTERS)
    if r.text in kept_texts:
        return "duplicate"
    if len(kept_texts) >= rule.keep_per_prompt:
        return "over_limit"
    return None


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
