"""Held-out evaluation after every stage: the numbers of the seed's emergence table.

Metrics (all over the same held-out rows):

- ``eval/accuracy``: greedy decoding, share of completions the reward passes (``scoring.passes``: >= 1).
- ``eval/pass@1``: mean correctness of ``sampling.num_generations`` sampled completions per prompt at
  ``sampling.temperature`` (the unbiased pass@1 estimator of Chen et al. 2021 with k=1 is exactly this mean).
- ``eval/mean_length``: greedy completion length in tokens (EOS not counted); the seed's
  "response length grows" curve.
- ``eval/format_rate``: share of greedy completions the registered ``format`` reward passes, the format
  training optimises: ``<think>`` non-empty reasoning ``</think>`` then ``<answer>...</answer>`` (or a final
  ``\\boxed{}``). A direct answer (empty think block) is not in format.
- ``eval/direct_answer_rate``: greedy completions with an empty ``<think></think>`` (no working).
- ``eval/accuracy_forced_reasoning``: greedy accuracy with the direct mode banned: where greedy
  decoding emitted ``<think></think>``, the token after ``<think>`` is re-chosen as the argmax over
  everything except ``</think>`` and greedy decoding continues. Compared with ``eval/accuracy`` it
  separates "RL taught better reasoning" from "RL taught the model to use the reasoning it already had"
  (the README's emergence table shows both). Needs ``<think>``/``</think>`` to be single tokens; otherwise NaN.
- The seed's emergence features (``grpo_core.evaluation.emergence``) of the sampled completions (the greedy ones when
  ``sampling.num_generations`` is 0): ``eval/direct_rate``, ``eval/mean_steps``, ``eval/reflection_rate``,
  ``eval/backtrack_rate``, and the sampled accuracy split by reflection, ``eval/accuracy_with_reflection`` /
  ``eval/accuracy_without_reflection`` (NaN where no completion falls in the group). Their mean length is
  ``eval/mean_length_sampled`` (``eval/mean_length`` without samples).
- On a task with tries (the countdown), whether reflection is checking that pays (``grpo_core.evaluation.checking``),
  over the same completions as the emergence features: ``eval/{source}/checking_rate``, ``/miss_retry_rate``,
  ``/hit_stop_rate``, ``/first_try_hit_rate``, ``/retry_hit_rate``, ``/reflection_after_hit_rate``,
  ``/reflection_without_try_rate`` for each source with tries, ``eval/checking_rate`` ... when it is the only source.
- With ``sampling.tools`` (``grpo_core.evaluation.tool_use``): every completion is a multi-turn trajectory whose tool
  calls the tools answer, as in GRPO's rollouts (the prompts carry the tools' schemas), and the tool use is reported
  beside the accuracy: ``eval/tools/call_rate`` (share of completions with a tool call),
  ``eval/tools/calls_per_response`` and ``eval/tools/error_rate`` (error turns per call) of the greedy completions, the
  same with ``_sampled`` of the sampled ones, per source too where accuracy is; each row of ``rows`` has its greedy
  completion's ``tool_calls`` and ``tool_errors``. Without tools none of these keys is there and generation is
  single-turn, as before.

General sources (``general_sources``: rows with no verifiable answer, e.g. the built-in helpful/unsafe
prompts) are measured apart, on greedy completions: ``eval/rm_score`` is the reward model's mean score
(``rm_reward``) and ``eval/preferred_rate`` the share the preference rule passes (``rule_reward``); the rule
made the reward model's training pairs but is never the RL reward, so a hacked reward model shows as a gap
between the two. The metrics above are then over the verifiable rows only, and every metric is also given
per source (``eval/{source}/accuracy``, ``eval/{source}/rm_score``, ``eval/{source}/preferred_rate``).

Several verifiable sources (the embedded default's chain and countdown): a source named in ``source_rewards`` is
scored by its own reward, the others by ``reward_func``, and every metric above, the emergence features included,
is also given per source (``eval/countdown/reflection_rate``), so a task that checks its work is not averaged with
one that never does.

Prompts longer than ``max_prompt_length`` are truncated or dropped by ``long_prompts``
(``generation.prompts.encode_prompts``, the call training makes); the counts are ``eval/prompts_truncated`` and
``eval/prompts_dropped``, and every other metric is over the rows kept (``eval/num_rows``).

Generation goes through a ``GenerationBackend`` (vLLM gets every prompt in one call and batches them itself;
transformers gets ``batch_size`` sequences at a time); scores through
``grpo_core.rewards.scoring.score_completions``, the trainer's own call, so evaluation scores exactly what
training rewards.
"""

from __future__ import annotations

import hashlib
import math
from pathlib import Path
from typing import Any

import torch

from grpo_core.config import BatchedSampling, EvalConfig
from grpo_core.evaluation.checking import CHECKING_KEYS, checking_stats, has_tries
from grpo_core.evaluation.emergence import emergence_metrics, is_direct
from grpo_core.evaluation.tool_use import ToolSampler, tool_use_metrics
from grpo_core.generation import GenerationBackend, GenerationRequest, Rollout, make_backend
from grpo_core.generation.prompts import all_dropped_error, encode_prompts
from grpo_core.generation.trajectory import TrajectoryStats
from grpo_core.rewards import get_reward_funcs
from grpo_core.rewards.base import RewardFunc
from grpo_core.rewards.scoring import passes, resolve_reward, score_completions

def sample_seed(seed: int, row_id: str, j: int) -> int:
    """Seed of sample ``j`` of a row: independent of batch composition and row order."""
    return int.from_bytes(hashlib.sha256(f"{seed}:{row_id}:{j}".encode()).digest()[:8], "big") >> 1


def completion_length(rollout: Rollout) -> int:
    return len(rollout.completion_ids) - (0 if rollout.truncated else 1)


def evaluate(config: EvalConfig, model: str | Path | torch.nn.Module, rows: list[dict[str, Any]], *,
             tokenizer: Any = None, backend: GenerationBackend | None = None, return_rows: bool = False,
             reward_func: RewardFunc | None = None) -> dict[str, Any]:
    """Evaluate ``model`` on prompt rows ``{id, prompt, answer, ...}`` (the first ``config.max_rows`` of each
    source) as ``config`` says; see the module docstring.

    ``model`` is a path or a loaded causal LM; ``backend`` defaults to transformers sampling with it;
    ``reward_func``, a callable, replaces ``config.reward_func`` (a notebook's own reward). With ``return_rows``
    the result has ``rows``: per-row completions and verdicts. Rows of ``config.general_sources`` are measured
    apart (``evaluate_general``); every metric is then also given per source, ``eval/{source}/...``.
    """
    if not rows:
        raise ValueError("evaluate got no rows; the held-out set is empty")
    if config.max_rows:
        rows = first_rows_per_source(rows, config.max_rows)
    general = set(config.general_sources)
    if general and config.rm_reward is None and config.rule_reward is None:
        raise ValueError("general_sources are set but neither rm_reward nor rule_reward: give at least one to "
                         "measure the general rows by")
    module, tokenizer, backend = _open(model, tokenizer, backend, need_module=bool(general) or config.forced_reasoning)
    reward = reward_func or config.reward_func
    if not general:
        return evaluate_verifiable(config, module, tokenizer, backend, rows, reward, return_rows)
    metrics: dict[str, Any] = {}
    out_rows: list[dict[str, Any]] = []
    if verifiable := [r for r in rows if r.get("source") not in general]:
        metrics = evaluate_verifiable(config, module, tokenizer, backend, verifiable, reward, True, per_source=True)
        out_rows = metrics.pop("rows")
    if general_rows := [r for r in rows if r.get("source") in general]:
        g_metrics, g_rows = evaluate_general(backend, tokenizer, general_rows, config)
        metrics.update(g_metrics)
        out_rows += g_rows
    if return_rows:
        metrics["rows"] = out_rows
    return metrics


def _open(model: str | Path | torch.nn.Module, tokenizer: Any, backend: GenerationBackend | None, *,
          need_module: bool) -> tuple[torch.nn.Module | None, Any, GenerationBackend]:
    """``(module, tokenizer, backend)``: the model loaded where it is needed (the transformers sampler, the
    forced-reasoning pass), the tokenizer from ``model``'s folder when not given, transformers sampling by default."""
    path = None if isinstance(model, torch.nn.Module) else Path(model)
    if tokenizer is None:
        from transformers import AutoTokenizer

        tokenizer = AutoTokenizer.from_pretrained(path)
    module = model if isinstance(model, torch.nn.Module) else None
    if module is None and (backend is None or need_module):
        from transformers import AutoModelForCausalLM

        module = AutoModelForCausalLM.from_pretrained(path)
    if backend is None:
        backend = make_backend("hf", str(path) if path else "", model=module, tokenizer=tokenizer)
    return module, tokenizer, backend


def evaluate_verifiable(config: EvalConfig, module: torch.nn.Module | None, tokenizer: Any,
                        backend: GenerationBackend, rows: list[dict[str, Any]], reward: str | RewardFunc,
                        return_rows: bool, per_source: bool = False) -> dict[str, Any]:
    """The metrics of rows with a verifiable answer: greedy, sampled (pass@1, emergence features), forced
    reasoning; ``rows`` (per-row verdicts) with ``return_rows``. A source named in ``config.source_rewards`` is
    scored by its own reward, the rest by ``reward``; with more than one source (or ``per_source``) every metric is
    also given per source (``eval/{source}/...``)."""
    s = config.sampling
    format_fn = get_reward_funcs(["format"])[0]
    tools = ToolSampler.of(s, tokenizer)  # None: single-turn completions
    encoded = encode_prompts(tokenizer, [r["prompt"] for r in rows], s.max_prompt_length, s.long_prompts,
                             tools=tools.schemas() if tools is not None else None)
    if not encoded.kept:
        raise all_dropped_error("evaluate", len(rows), s.max_prompt_length)
    row_ids = [str(rows[i].get("id", i)) for i in encoded.kept]  # seeds keep the row's original index
    rows, prompt_ids = [rows[i] for i in encoded.kept], encoded.ids
    correct = SourceRewards(config.source_rewards, reward, rows)

    greedy_use, sampled_use = TrajectoryStats(), TrajectoryStats()  # tool calls per completion, in order
    greedy = _generate(backend, prompt_ids, n=1, max_tokens=s.max_completion_length, greedy=True, batch=s.batch_size,
                       tools=tools, stats=greedy_use)
    greedy_ok = correct(greedy, 1, s.max_completion_length)
    formatted = passes(score_completions([format_fn], ["format"], rows, greedy, 1, s.max_completion_length)[:, 0])
    texts = [g.text for g in greedy]
    sampled, sampled_ok = [], []
    if s.num_generations > 0:
        seeds = [sample_seed(config.seed, row_id, j) for row_id in row_ids for j in range(s.num_generations)]
        sampled = sample(backend, prompt_ids, s, seeds, tools=tools, stats=sampled_use)
        sampled_ok = correct(sampled, s.num_generations, s.max_completion_length)
    forced, forced_ok = None, greedy_ok
    if config.forced_reasoning:
        forced = force_reasoning(module, tokenizer, backend, prompt_ids, greedy, s.max_completion_length, s.batch_size,
                                 tools=tools)
        if forced is not None:
            forced_ok = correct(forced, 1, s.max_completion_length)
    forced_texts = [f.text for f in forced] if forced is not None else texts
    k = max(s.num_generations, 1)

    def measure(idx: list[int], prefix: str, checking: bool = True) -> dict[str, Any]:
        """The metrics over the rows ``idx``, keys ``{prefix}accuracy`` and the rest (the checking numbers where
        ``checking`` and the rows have tries)."""
        out: dict[str, Any] = {
            "accuracy": _mean([greedy_ok[i] for i in idx]),
            "mean_length": _mean([completion_length(greedy[i]) for i in idx]),
            "format_rate": _mean([formatted[i] for i in idx]),
            "direct_answer_rate": _mean([is_direct(texts[i]) for i in idx]),
            "num_rows": len(idx),
        }
        population = [greedy[i] for i in idx]  # what the emergence features describe
        population_ok = [greedy_ok[i] for i in idx]
        prompts = [rows[i]["prompt"] for i in idx]
        if sampled:
            population = [sampled[i * k + j] for i in idx for j in range(k)]
            prompts = [rows[i]["prompt"] for i in idx for _ in range(k)]
            population_ok = [sampled_ok[i * k + j] for i in idx for j in range(k)]
            out["pass@1"] = _mean(population_ok)
            out["mean_length_sampled"] = _mean([completion_length(r) for r in population])
        features = emergence_metrics([r.text for r in population], correct=population_ok,
                                     reflection_phrases=config.emergence.reflection_phrases,
                                     backtrack_phrases=config.emergence.backtrack_phrases)
        out.update({k_: v for k_, v in features.items() if k_ != "mean_length"})  # length: above
        if checking and has_tries(prompts):
            tries = checking_stats([r.text for r in population], prompts, config.emergence.reflection_phrases)
            out.update({k_: tries[k_] for k_ in CHECKING_KEYS})
        if config.forced_reasoning:
            out["accuracy_forced_reasoning"] = math.nan if forced is None else _mean([forced_ok[i] for i in idx])
        if tools is not None:
            out.update(tool_use_metrics([greedy_use.tool_calls[i] for i in idx],
                                        [greedy_use.tool_errors[i] for i in idx]))
            if sampled:
                mine = [i * k + j for i in idx for j in range(k)]
                rates = tool_use_metrics([sampled_use.tool_calls[m] for m in mine],
                                         [sampled_use.tool_errors[m] for m in mine])
                out.update({f"{key}_sampled": value for key, value in rates.items()})
        return {f"{prefix}{key}": value for key, value in out.items()}

    sources = [str(r.get("source")) for r in rows]
    metrics = {**measure(list(range(len(rows))), "eval/", checking=len(set(sources)) == 1),
               **encoded.counts("eval/prompts_")}
    if per_source or len(set(sources)) > 1:
        for source in sorted(set(sources)):
            metrics.update(measure([i for i, x in enumerate(sources) if x == source], f"eval/{source}/"))
    if return_rows:
        metrics["rows"] = [
            {"id": r.get("id"), "source": r.get("source"), "prompt": r.get("prompt"), "answer": r.get("answer"),
             "greedy": texts[i],
             "correct": greedy_ok[i],
             "format": formatted[i], "forced": forced_texts[i], "forced_correct": forced_ok[i],
             "pass@1": _mean(sampled_ok[i * k:(i + 1) * k]) if sampled_ok else math.nan,
             **({"tool_calls": greedy_use.tool_calls[i], "tool_errors": greedy_use.tool_errors[i]} if tools else {})}
            for i, r in enumerate(rows)
        ]
    return metrics


class SourceRewards:
    """Correctness of completions of ``rows`` (each row's ``num_generations`` contiguous): each row scored by its
    source's reward in ``by_source``, or by ``default`` (``score_completions`` with routes, the trainer's call)."""

    def __init__(self, by_source: dict[str, str], default: str | RewardFunc, rows: list[dict[str, Any]]) -> None:
        routes: dict[str | None, list[int]] = {}  # source with its own reward (None: the default) -> row indices
        for i, row in enumerate(rows):
            source = str(row.get("source"))
            routes.setdefault(source if source in by_source else None, []).append(i)
        self.funcs, self.names = zip(*(resolve_reward(by_source[src] if src is not None else default) for src in routes))
        self.routes, self.rows = list(routes.values()), rows

    def __call__(self, completions: list[Rollout], num_generations: int, max_completion_length: int) -> list[bool]:
        scores = score_completions(self.funcs, self.names, self.rows, completions, num_generations,
                                   max_completion_length, routes=self.routes)  # [B, R]: one score per row
        return passes(torch.nan_to_num(scores, nan=-math.inf).max(dim=1).values)


def evaluate_general(backend: GenerationBackend, tokenizer: Any, rows: list[dict[str, Any]], config: EvalConfig
                     ) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """Greedy completions of general rows measured two ways: ``eval/rm_score``, the reward model's mean score,
    and ``eval/preferred_rate``, the share the preference rule passes (a reward model that is hacked shows as a
    gap between the two); both also per source. NaN scores (the reward failed or does not apply) are left out
    of the mean and counted in ``eval/rm_unscored``."""
    s = config.sampling
    tools = ToolSampler.of(s, tokenizer)  # with sampling.tools, general rows are answered with them too
    encoded = encode_prompts(tokenizer, [r["prompt"] for r in rows], s.max_prompt_length, s.long_prompts,
                             tools=tools.schemas() if tools is not None else None)
    if not encoded.kept:
        raise all_dropped_error("evaluate", len(rows), s.max_prompt_length)
    rows = [rows[i] for i in encoded.kept]
    greedy = _generate(backend, encoded.ids, n=1, max_tokens=s.max_completion_length, greedy=True, batch=s.batch_size,
                       tools=tools)
    sources = [str(r.get("source")) for r in rows]
    metrics: dict[str, Any] = {"eval/general_num_rows": len(rows), "eval/general_mean_length":
                               _mean([completion_length(g) for g in greedy])}
    out = [{"id": r.get("id"), "source": s, "greedy": g.text} for r, s, g in zip(rows, sources, greedy)]
    for key, reward, verdict in (("rm_score", config.rm_reward, False), ("preferred_rate", config.rule_reward, True)):
        if reward is None:
            continue
        fn, name = resolve_reward(reward)
        scores = score_completions([fn], [name], rows, greedy, 1, s.max_completion_length)[:, 0]  # [N]
        values = passes(scores) if verdict else scores.tolist()
        scored = [(s, v) for s, v, x in zip(sources, values, scores.tolist()) if not math.isnan(x)]
        if not verdict:
            metrics["eval/rm_unscored"] = len(rows) - len(scored)
        metrics[f"eval/{key}"] = _mean([v for _, v in scored])
        for source in sorted(set(sources)):
            metrics[f"eval/{source}/{key}"] = _mean([v for s, v in scored if s == source])
        for row, v, x in zip(out, values, scores.tolist()):
            row[key] = None if math.isnan(x) else v
    return metrics, out


def first_rows_per_source(rows: list[dict[str, Any]], max_rows: int) -> list[dict[str, Any]]:
    """The first ``max_rows`` rows of each source, in input order (one source: the first ``max_rows`` rows)."""
    counts: dict[Any, int] = {}
    out = []
    for row in rows:
        source = row.get("source")
        if counts.get(source, 0) < max_rows:
            counts[source] = counts.get(source, 0) + 1
            out.append(row)
    return out


def force_reasoning(model: torch.nn.Module | None, tokenizer: Any, backend: GenerationBackend,
                    prompt_ids: list[list[int]], greedy: list[Rollout], max_new_tokens: int, batch_size: int, *,
                    tools: ToolSampler | None = None) -> list[Rollout] | None:
    """Greedy rollouts with an empty think block banned (see module docstring); None if not applicable. With
    ``tools`` the redone completions go on as trajectories, as the greedy ones did."""
    think, end_think = (_single_token_id(tokenizer, t) for t in ("<think>", "</think>"))
    if model is None or think is None or end_think is None or max_new_tokens < 3:
        return None
    redo = [i for i, g in enumerate(greedy) if g.completion_ids[:2] == [think, end_think]]
    out = list(greedy)
    if not redo:
        return out
    banned = [end_think] + ([tokenizer.eos_token_id] if tokenizer.eos_token_id is not None else [])
    prefixes = [prompt_ids[i] + [think] for i in redo]
    first = _argmax_next_token(model, prefixes, banned, tokenizer.pad_token_id or 0)
    continued = _generate(backend, [p + [t] for p, t in zip(prefixes, first)], n=1, max_tokens=max_new_tokens - 2,
                          greedy=True, batch=batch_size, tools=tools)
    for i, t, c in zip(redo, first, continued):
        head = tokenizer.decode([think, t], skip_special_tokens=True)
        out[i] = Rollout(prompt_ids[i], [think, t] + c.completion_ids, None, c.truncated, head + c.text,
                         tool_mask=[0, 0] + c.tool_mask if c.tool_mask is not None else None)
    return out


@torch.inference_mode()
def _argmax_next_token(model: torch.nn.Module, prefixes: list[list[int]], banned: list[int], pad_id: int) -> list[int]:
    """Greedy next token of each prefix with ``banned`` ids excluded (one left-padded forward pass)."""
    was_training = model.training
    model.eval()
    device = next(model.parameters()).device
    length = max(len(p) for p in prefixes)
    ids = torch.full((len(prefixes), length), pad_id, dtype=torch.long)  # [P, L]
    mask = torch.zeros_like(ids)  # [P, L]
    for i, p in enumerate(prefixes):
        ids[i, length - len(p):] = torch.tensor(p)
        mask[i, length - len(p):] = 1
    position_ids = (mask.cumsum(-1) - 1).clamp(min=0)  # [P, L]
    logits = model(input_ids=ids.to(device), attention_mask=mask.to(device), position_ids=position_ids.to(device),
                   logits_to_keep=1).logits[:, -1].float()  # [P, V]
    logits[:, banned] = float("-inf")
    model.train(was_training)
    return logits.argmax(-1).tolist()


def _single_token_id(tokenizer: Any, text: str) -> int | None:
    ids = tokenizer(text, add_special_tokens=False)["input_ids"]
    return ids[0] if len(ids) == 1 else None


def sample(backend: GenerationBackend, prompt_ids: list[list[int]], sampling: BatchedSampling, seeds: list[int], *,
           tools: ToolSampler | None = None, stats: TrajectoryStats | None = None) -> list[Rollout]:
    """``sampling.num_generations`` seeded samples per prompt with ``sampling``'s temperature, top-p/k and
    length, ``sampling.batch_size`` sequences per transformers call (evaluation, rejection sampling, a teacher);
    with ``tools``, multi-turn trajectories (``ToolSampler``; ``stats`` gets their counts)."""
    n = sampling.num_generations
    return _generate(backend, prompt_ids, n=n, max_tokens=sampling.max_completion_length, greedy=False,
                     batch=max(1, sampling.batch_size // n),
                     temperature=sampling.temperature, top_p=sampling.top_p, top_k=sampling.top_k, seeds=seeds,
                     tools=tools, stats=stats)


def _generate(backend: GenerationBackend, prompt_ids: list[list[int]], *, n: int, max_tokens: int, greedy: bool,
              batch: int, temperature: float = 1.0, top_p: float = 1.0, top_k: int = 0,
              seeds: list[int] | None = None, tools: ToolSampler | None = None,
              stats: TrajectoryStats | None = None) -> list[Rollout]:
    """``n`` rollouts per prompt, ``batch`` prompts per ``generate`` call, or all of them in one call when the
    backend schedules its own batches (vLLM's continuous batching: ``batches_itself``); the transformers
    sampler's memory grows with its batch, so it keeps ``batch``. Seeds are per completion, so the results
    do not depend on the split. ``tools``: multi-turn trajectories of ``max_tokens`` tokens in all, their counts
    appended to ``stats`` in order."""
    if getattr(backend, "batches_itself", False):
        batch = max(1, len(prompt_ids))
    out: list[Rollout] = []
    for start in range(0, len(prompt_ids), batch):
        chunk = prompt_ids[start: start + batch]
        chunk_seeds = seeds[start * n: (start + len(chunk)) * n] if seeds is not None else [0] * (len(chunk) * n)
        request = GenerationRequest(n=n, max_tokens=max_tokens, temperature=temperature, top_p=top_p, top_k=top_k,
                                    seeds=chunk_seeds, greedy=greedy, logprobs=False)
        out += backend.generate(chunk, request) if tools is None else tools.generate(backend, chunk, request, stats)
    return out


def _mean(values: list[Any]) -> float:
    return float(sum(values)) / len(values) if values else math.nan
