"""Math benchmarks under the DeepSeek-R1 paper's evaluation protocol: pass@1 over n samples, pass@k, maj@k
(cons@k) and greedy accuracy, per benchmark.

    from grpo_core.evaluation.benchmarks import evaluate_benchmarks
    evaluate_benchmarks(EvalConfig(benchmarks=["math500"], sampling={"num_generations": 16}, k=[1, 16]),
                        "/models/r1-distill")

Built-in benchmarks (hub dataset, split, fields; a local copy in the same schema is read by giving
``{benchmark: NAME, path: FILE}``):

- ``math500``: ``HuggingFaceH4/MATH-500`` test, ``problem`` / ``answer`` (LaTeX), id ``unique_id``
- ``gsm8k``: ``openai/gsm8k`` config ``main`` test, ``question`` / ``answer`` (solution ending ``#### N``)
- ``aime24``: ``HuggingFaceH4/aime_2024`` train (its only split: the 30 problems), ``problem`` / ``answer``, ``id``
- ``aime25``: ``yentinglin/aime_2025`` train (its only split: the 30 problems), ``problem`` / ``answer``, ``id``

Any other jsonl/json/parquet/csv file or hub dataset is a ``BenchmarkSource`` with a ``field_map``.

Protocol (DeepSeek-R1, section 3.1 "Evaluation Setup"): sampling at temperature 0.6 and top-p 0.95
(``EvalSampling`` defaults), n samples per problem, the prompt asking for a boxed answer
("Please reason step by step, and put your final answer within \\boxed{}.", DeepSeek's usage
recommendation). pass@1 is the mean correctness of the n samples; pass@k and maj@k (``grpo_core.evaluation.passk``)
for each configured k. maj@k votes over the answers ``extract_answer`` finds, grouped by math-verify
equivalence (``answers_equivalent``); correctness is the benchmark's reward (``math_accuracy`` by default),
scored through ``score_completions`` as training scores. Greedy accuracy is a separate column. With
``sampling.tools`` the samples and the greedy completion are multi-turn trajectories with the tools' answers
(``evaluation.tool_use``), as on the held-out set, and the tool use is reported beside the accuracy as there:
``tools/call_rate``, ``calls_per_response``, ``error_rate`` of the greedy completions and ``..._sampled`` of the
samples (``eval/{benchmark}/tools/...``); each problem's results hold ``tool_calls`` (per sample) and
``greedy_tool_calls``.
"""

from __future__ import annotations

import hashlib
import json
import math
from pathlib import Path
from typing import TYPE_CHECKING, Any

from grpo_core.config import BENCHMARKS, BenchmarkSource, EvalConfig
from grpo_core.data.rows import load_prompt_rows
from grpo_core.evaluation.heldout import _generate, _mean, completion_length, sample, sample_seed
from grpo_core.evaluation.tool_use import ToolSampler, tool_use_metrics
from grpo_core.evaluation.passk import maj_at_k, pass_at_k
from grpo_core.generation import make_backend
from grpo_core.generation.prompts import all_dropped_error, encode_prompts
from grpo_core.generation.trajectory import TrajectoryStats
from grpo_core.rewards.extract import ExtractedAnswer, extract_answer
from grpo_core.rewards.math import score_answers
from grpo_core.rewards.scoring import passes, resolve_reward, score_completions

if TYPE_CHECKING:  # torch and the generation stack load on use
    from grpo_core.generation import GenerationBackend

def resolve_benchmark(spec: str | BenchmarkSource) -> BenchmarkSource:
    """A built-in name -> its source; a source naming a built-in takes the built-in's fields it does not set
    (so ``{benchmark: math500, path: math500_test.json}`` reads a local copy with MATH-500's schema)."""
    if isinstance(spec, str):
        if spec not in BENCHMARKS:
            raise ValueError(f"unknown benchmark {spec!r}; built-in: {', '.join(BENCHMARKS)}")
        return BENCHMARKS[spec]
    base = BENCHMARKS.get(spec.benchmark)
    if base is None:
        return spec
    return BenchmarkSource.model_validate({**base.model_dump(), **spec.model_dump(exclude_unset=True)})


def load_benchmark(spec: str | BenchmarkSource, limit: int | None = None) -> list[dict[str, Any]]:
    """The benchmark's problems as prompt rows ``{id, prompt, answer, task, source}`` (``grpo_core.data``:
    errors name the file, row and field), the first ``limit`` of them."""

    src = resolve_benchmark(spec)
    if limit is not None:
        src = src.model_copy(update={"max_rows": min(limit, src.max_rows or limit)})
    rows, _ = load_prompt_rows(src)
    return rows


def rows_digest(rows: list[dict[str, Any]]) -> str:
    """sha256 of the rows (what the evaluation's fingerprint records of a benchmark's content)."""
    return hashlib.sha256(json.dumps(rows, sort_keys=True, default=str).encode()).hexdigest()[:16]


def answers_equivalent(a: ExtractedAnswer, b: ExtractedAnswer) -> bool:
    """math-verify equivalence of two extracted answers (``a`` as the gold side), bounded in time by the
    verifier pool: ``0.5`` and ``\\frac{1}{2}`` vote together."""

    return score_answers([b], [a.text], reward_name="maj_vote")[0] == 1.0


def evaluate_benchmark(
    backend: GenerationBackend,
    tokenizer: Any,
    rows: list[dict[str, Any]],
    config: EvalConfig,
    *,
    reward_func: str = "math_accuracy",
    greedy: bool = True,
) -> tuple[dict[str, float], list[dict[str, Any]]]:
    """``(metrics, per-problem results)`` of one benchmark: ``pass@1``, ``pass@{k}``, ``maj@{k}`` for each
    ``config.ks``, ``greedy``, ``mean_length``, ``num_rows`` (keys without the ``eval/{benchmark}/`` prefix)."""

    if not rows:
        raise ValueError("the benchmark has no problems")
    s = config.sampling
    n, ks = s.num_generations, config.ks
    fn, name = resolve_reward(reward_func)
    tools = ToolSampler.of(s, tokenizer)  # sampling.tools: multi-turn completions, as on the held-out set
    encoded = encode_prompts(tokenizer, [r["prompt"] for r in rows], s.max_prompt_length, s.long_prompts,
                             tools=tools.schemas() if tools is not None else None)
    if not encoded.kept:
        raise all_dropped_error("benchmark evaluation", len(rows), s.max_prompt_length)
    row_ids = [str(rows[i].get("id", i)) for i in encoded.kept]
    rows, prompt_ids = [rows[i] for i in encoded.kept], encoded.ids
    seeds = [sample_seed(config.seed, row_id, j) for row_id in row_ids for j in range(n)]
    use = TrajectoryStats() if tools is not None else None  # each sample's tool calls and error turns
    sampled = sample(backend, prompt_ids, s, seeds, tools=tools, stats=use)
    correct = passes(score_completions([fn], [name], rows, sampled, n, s.max_completion_length)[:, 0])
    answers = [extract_answer(s.text) for s in sampled]
    results: list[dict[str, Any]] = []
    for i, row in enumerate(rows):
        ok, ans = correct[i * n:(i + 1) * n], answers[i * n:(i + 1) * n]
        c = sum(ok)
        result = {"id": row.get("id"), "source": row.get("source"), "answer": row.get("answer"),
                  "samples": [s.text for s in sampled[i * n:(i + 1) * n]],
                  "extracted": [a.text if a else None for a in ans], "correct": ok, "num_correct": c,
                  "pass@1": c / n}
        if use is not None:
            result["tool_calls"] = use.tool_calls[i * n:(i + 1) * n]
        for k in ks:
            result[f"pass@{k}"] = pass_at_k(n, c, k)
            result[f"maj@{k}"] = maj_at_k(ans, ok, k, answers_equivalent)
        results.append(result)
    metrics: dict[str, float] = {"pass@1": _mean([r["pass@1"] for r in results])}
    for k in ks:
        metrics[f"pass@{k}"] = _mean([r[f"pass@{k}"] for r in results])
        metrics[f"maj@{k}"] = _mean([r[f"maj@{k}"] for r in results])
    if use is not None:
        metrics.update({f"{k}_sampled": v for k, v in tool_use_metrics(use.tool_calls, use.tool_errors).items()})
    if greedy:
        greedy_use = TrajectoryStats() if tools is not None else None
        greedy_out = _generate(backend, prompt_ids, n=1, max_tokens=s.max_completion_length, greedy=True,
                               batch=s.batch_size, tools=tools, stats=greedy_use)
        greedy_ok = passes(score_completions([fn], [name], rows, greedy_out, 1, s.max_completion_length)[:, 0])
        for result, g, ok in zip(results, greedy_out, greedy_ok):
            result.update(greedy=g.text, greedy_correct=ok)
        metrics["greedy"] = _mean(greedy_ok)
        if greedy_use is not None:
            metrics.update(tool_use_metrics(greedy_use.tool_calls, greedy_use.tool_errors))
            for result, calls in zip(results, greedy_use.tool_calls):
                result["greedy_tool_calls"] = calls
    metrics.update({"mean_length": _mean([completion_length(s) for s in sampled]), "num_rows": float(len(rows)),
                    **{k: float(v) for k, v in encoded.counts("prompts_").items()}})
    metrics.update(per_source(results))
    return metrics, results


PER_SOURCE_KEYS = {"pass@1": "pass@1", "greedy_correct": "greedy"}  # row key -> metric name


def per_source(results: list[dict[str, Any]]) -> dict[str, float]:
    """``{source}/{metric}`` means of the per-row ``PER_SOURCE_KEYS`` when the rows come from more than one
    source; empty otherwise."""
    sources = sorted({str(r.get("source")) for r in results})
    if len(sources) < 2:
        return {}
    out = {}
    for src in sources:
        mine = [r for r in results if str(r.get("source")) == src]
        for key, metric in PER_SOURCE_KEYS.items():
            values = [float(r[key]) for r in mine if r.get(key) is not None]
            if values:
                out[f"{src}/{metric}"] = sum(values) / len(values)
    return out


def evaluate_benchmarks(
    config: EvalConfig,
    model: str | Path,
    *,
    tokenizer: Any = None,
    backend: GenerationBackend | None = None,
    benchmark_rows: dict[str, list[dict[str, Any]]] | None = None,
) -> tuple[dict[str, float], dict[str, list[dict[str, Any]]]]:
    """Every benchmark of ``config``: ``({"eval/{benchmark}/{metric}": value}, {benchmark: results})``.

    ``backend``: transformers sampling from ``model`` when None; ``benchmark_rows``: rows already loaded
    (``load_benchmark``), else loaded here."""
    if tokenizer is None:
        from transformers import AutoTokenizer

        tokenizer = AutoTokenizer.from_pretrained(model)
    if backend is None:
        backend = make_backend("hf", str(model), tokenizer=tokenizer)
    metrics: dict[str, float] = {}
    results: dict[str, list[dict[str, Any]]] = {}
    for spec in config.benchmarks:
        src = resolve_benchmark(spec)
        rows = (benchmark_rows or {}).get(src.benchmark)
        if rows is None:
            rows = load_benchmark(src, config.limit)
        values, results[src.benchmark] = evaluate_benchmark(backend, tokenizer, rows, config,
                                                            reward_func=src.reward_func)
        metrics.update({f"eval/{src.benchmark}/{k}": v for k, v in values.items()
                        if not (isinstance(v, float) and math.isnan(v))})
    return metrics, results
