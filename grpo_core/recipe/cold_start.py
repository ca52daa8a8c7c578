"""Cold-start chains of thought (R1 sec. 2.3.1) from a trace set or a teacher model, readable and verified.

Both kinds end in the pipeline's cold-start layout, SFT rows ``{prompt, completion}`` with::

    completion = "<think>\\n{reasoning}\\n</think>\\n\\n{summary}"

R1's "|special_token|<reasoning_process>|special_token|<summary>" with the ``<think>`` tags this pipeline's
format reward and GRPO use. A sample is kept when it is verified, passes every readability filter
(``grpo_core.data.readability``), is not a repeat of one kept for that prompt, and fewer than ``keep_per_prompt``
were kept before it (in source/sample order). Every sample is counted once: ``samples = kept + unverified +
duplicate + over_limit + sum(rejected/{filter})``.

- ``kind: traces`` (``load_trace_rows``): a data set whose rows hold a problem, a list of generations and a
  list of verdicts, e.g. ``open-r1/OpenR1-Math-220k`` (problem, generations, correctness_math_verify, ...),
  from the hub by name or from a local file in that schema. The set's own verdicts verify.
- ``kind: teacher`` (``sample_teacher_traces``): the teacher samples ``sampling.num_generations`` per prompt
  after a few-shot long-CoT prompt (the examples as earlier user/assistant turns, left out of the written
  rows); ``reward_func`` verifies them through ``score_completions``, the call training makes. They are written
  as sampled (the text the reward passed, in the layout the teacher was taught), not re-spaced.
  Departure from R1: no human post-processing of the traces; the filters stand in for it.
"""

from __future__ import annotations

from collections import Counter
from typing import Any, Sequence

from grpo_core.config import DatasetSource, ReadabilityConfig, TeacherSource, TraceSource
from grpo_core.data.readability import FILTERS, readability_reason, split_reasoning
from grpo_core.data.rows import (RAW_PROMPT, DataError, LoadStats, load_prompt_rows, load_sft_rows, raw_prompt_text,
                                 read_records, to_messages)

COUNTS = ("samples", "kept", "unverified", "duplicate", "over_limit")


def to_cold_start_completion(generation: str) -> str:
    """A ``<think>..</think> summary`` generation in the cold-start layout; text without ``</think>`` as it is
    (the truncation filter drops it)."""
    parts = split_reasoning(generation)
    if parts is None:
        return generation
    reasoning, summary = parts
    return f"<think>\n{reasoning.strip()}\n</think>\n\n{summary.strip()}"


class _Keeper:
    """Applies verification, readability, dedupe and the per-prompt cap; counts every sample once."""

    def __init__(self, readability: ReadabilityConfig, keep_per_prompt: int, tokenizer: Any = None, *,
                 convert: bool = True) -> None:
        if readability.max_tokens is not None and tokenizer is None:
            raise ValueError("readability.max_tokens needs a tokenizer; give the source a model or use max_chars")
        self.readability, self.k, self.tokenizer, self.convert = readability, keep_per_prompt, tokenizer, convert
        self.counts: Counter[str] = Counter()
        self.rows: list[dict[str, Any]] = []

    def add_prompt(self, prompt: list[dict[str, str]], samples: Sequence[tuple[str, bool]], raw: str | None = None
                   ) -> None:
        """``raw``: the prompt's text before its template (``RAW_PROMPT``, what decontamination compares)."""
        kept: list[str] = []
        for text, verified in samples:
            self.counts["samples"] += 1
            completion = to_cold_start_completion(text) if self.convert else text
            num_tokens = (len(self.tokenizer(completion, add_special_tokens=False)["input_ids"])
                          if self.readability.max_tokens is not None else None)
            reason = None if verified else "unverified"
            reason = reason or readability_reason(completion, prompt, self.readability, num_tokens)
            if reason is None and completion in kept:
                reason = "duplicate"
            if reason is None and len(kept) >= self.k:
                reason = "over_limit"
            if reason is None:
                kept.append(completion)
            else:
                name = reason.split(":", 1)[0]
                self.counts[f"rejected/{name}" if name in FILTERS else name] += 1
        self.counts["kept"] += len(kept)
        self.rows += [{"prompt": prompt, "completion": c, **({RAW_PROMPT: raw} if raw else {})} for c in kept]

    def stats(self, **extra: Any) -> dict[str, Any]:
        out: dict[str, Any] = {key: self.counts.get(key, 0) for key in COUNTS}
        out.update({f"rejected/{f}": self.counts.get(f"rejected/{f}", 0) for f in FILTERS})
        return {**out, **extra}


# ---------------------------------------------------------------- kind: traces


def _as_list(value: Any, location: str, column: str) -> list[Any]:
    if isinstance(value, str):
        return [value]
    if isinstance(value, (list, tuple)):
        return list(value)
    raise DataError(f"{location}: column {column!r} must be a list (or one string), got {type(value).__name__}")


def load_trace_rows(src: TraceSource, *, on_error: str = "raise") -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """Cold-start rows from a trace set: verified generations (``correct``), readable, ``keep_per_prompt`` each."""
    fmap = src.field_map
    load = LoadStats()
    records = read_records(src.dataset, split=src.split, name=src.name, on_error=on_error, stats=load)  # type: ignore[arg-type]
    keeper = _Keeper(src.readability, src.keep_per_prompt)
    problems = 0
    for location, record in records:
        if src.limit is not None and problems >= src.limit:
            break
        problems += 1
        try:
            for key in ("prompt", "generations") + (("correct",) if "correct" in fmap else ()):
                if record.get(fmap[key]) in (None, "", []):
                    raise DataError(f"{location}: field {key!r} (column {fmap[key]!r}) is missing or empty; columns "
                                    f"present: {sorted(record)}. Map it with field_map: {{{key!r}: '<column>'}}")
            prompt = to_messages(record[fmap["prompt"]], template=src.prompt_template)
            generations = _as_list(record[fmap["generations"]], location, fmap["generations"])
            verdicts = (_as_list(record[fmap["correct"]], location, fmap["correct"]) if "correct" in fmap
                        else [True] * len(generations))
            if len(verdicts) != len(generations):
                raise DataError(f"{location}: {len(generations)} generations but {len(verdicts)} verdicts in column "
                                f"{fmap['correct']!r}; they pair up one to one")
            if not all(isinstance(g, str) for g in generations):
                raise DataError(f"{location}: column {fmap['generations']!r} must hold strings")
        except (DataError, ValueError) as e:
            if on_error == "raise":
                raise DataError(f"{e}. Or set on_error: skip to skip and count bad rows.") from None
            load.skip(str(e))
            continue
        raw = raw_prompt_text(record[fmap["prompt"]]) if src.prompt_template else None
        keeper.add_prompt(prompt, [(g, v is True) for g, v in zip(generations, verdicts)], raw)
    return keeper.rows, keeper.stats(problems=problems, rows_skipped=load.rows_skipped, errors=load.errors)


# ---------------------------------------------------------------- kind: teacher


def few_shot_prompt(few_shot: Sequence[Any], prompt: list[dict[str, str]]) -> list[dict[str, str]]:
    """The worked examples as user/assistant turns, then the prompt (its system turn, if any, first)."""
    system = [m for m in prompt if m["role"] == "system"]
    shots = [turn for ex in few_shot for turn in ({"role": "user", "content": ex.prompt},
                                                  {"role": "assistant", "content": ex.completion})]
    return system + shots + [m for m in prompt if m["role"] != "system"]


def sample_teacher_traces(src: TeacherSource, rows: list[dict[str, Any]], *, backend: Any = None,
                          tokenizer: Any = None) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """Cold-start rows sampled from ``src.model`` on ``rows`` (prompt rows with the reward's columns, e.g.
    ``answer``) as ``src.sampling`` says; ``backend``/``tokenizer`` default to one loaded from ``src.model``."""
    # heavy import (torch): only a teacher source samples; prepare_data reads other sources without it
    from grpo_core.evaluation.heldout import sample, sample_seed
    from grpo_core.generation import backend_kind, backend_options, make_backend
    from grpo_core.generation.prompts import all_dropped_error, encode_prompts
    from grpo_core.rewards.scoring import passes, resolve_reward, score_completions

    s = src.sampling
    rows = rows[: src.max_prompts] if src.max_prompts else rows
    if not rows:
        raise ValueError(f"teacher cold start ({src.model}) got no prompt rows")
    if tokenizer is None:
        from transformers import AutoTokenizer

        tokenizer = AutoTokenizer.from_pretrained(src.model)
    own_backend = backend is None
    if backend is None:
        import torch

        kind = backend_kind(s.use_vllm)
        opts = {} if kind == "hf" else backend_options(s, kind, torch.device("cpu"), seed=src.seed)
        backend = make_backend(kind, src.model, tokenizer=tokenizer, **opts)
    n = s.num_generations
    prompts = [to_messages(r["prompt"]) for r in rows]
    encoded = encode_prompts(tokenizer, [few_shot_prompt(src.few_shot, p) for p in prompts],
                             s.max_prompt_length, s.long_prompts)
    if not encoded.kept:
        raise all_dropped_error("teacher cold start", len(rows), s.max_prompt_length)
    kept_rows = [rows[i] for i in encoded.kept]
    seeds = [sample_seed(src.seed, str(rows[i].get("id", i)), j) for i in encoded.kept for j in range(n)]
    try:
        rollouts = sample(backend, encoded.ids, s, seeds)
    finally:
        if own_backend and hasattr(backend, "close"):  # a vLLM engine holds its memory until closed
            backend.close()
    func, name = resolve_reward(src.reward_func)
    scores = score_completions([func], [name], kept_rows, rollouts, n, s.max_completion_length)  # [N*n, 1]
    verified = passes(scores[:, 0], src.reward_threshold)
    keeper = _Keeper(src.readability, src.keep_per_prompt, tokenizer, convert=False)  # written as verified
    for p, i in enumerate(encoded.kept):
        keeper.add_prompt(prompts[i], [(rollouts[p * n + j].text, verified[p * n + j]) for j in range(n)],
                          rows[i].get(RAW_PROMPT))
    return keeper.rows, keeper.stats(prompts=len(encoded.kept), prompts_dropped=encoded.num_dropped)


# ---------------------------------------------------------------- one entry for prepare_data


def load_cold_start_source(src: DatasetSource | TraceSource | TeacherSource, train_rows: list[dict[str, Any]], *,
                           on_error: str = "raise") -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """``(rows, stats)`` of one ``cold_start_sources`` entry; a teacher without ``prompts`` samples on ``train_rows``."""

    if isinstance(src, TraceSource):
        return load_trace_rows(src, on_error=on_error)
    if isinstance(src, TeacherSource):
        prompts = (load_prompt_rows(src.prompts, on_error=on_error, keep_raw=True)[0]  # type: ignore[arg-type]
                   if src.prompts else train_rows)
        return sample_teacher_traces(src, prompts)
    rows, stats = load_sft_rows(src, on_error=on_error, keep_raw=True)  # type: ignore[arg-type]
    return rows, stats.as_dict()


def source_key(src: DatasetSource | TraceSource | TeacherSource) -> str:
    """How the data stats name a cold-start source."""
    if isinstance(src, TraceSource):
        return f"cold_start:traces:{src.dataset}"
    if isinstance(src, TeacherSource):
        return f"cold_start:teacher:{src.model}"
    return f"cold_start:{src.path}"
