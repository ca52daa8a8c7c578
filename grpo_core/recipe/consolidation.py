"""The consolidation SFT set as R1 built it (sec. 2.3.3): rejection-sampled reasoning mixed with general data.

R1 fine-tuned on ~600k reasoning samples and ~200k non-reasoning ones (writing, factual QA, self-cognition,
translation), about 3:1. Not every rejection-sampled row is reasoning: rejection sampling also answers general
prompts (kept where a reward model scores them high), and those, like cold-start rows of a general source, are
general data. A source is general when its prompts have no reference answer (``general_source_names``:
``answer_format: none``, the built-in helpful/unsafe); rows of other sources, or with no source, are reasoning.

``mix_by_ratio`` takes every reasoning row and ``round(n / ratio)`` general rows, a seeded sample of one pool
holding the general rows already in the set and the general sources' rows, so the counts match the ratio within
one row; when the general pool is too small it takes all of it and samples the reasoning rows down to
``round(general * ratio)`` instead. Every row carries a ``source`` column (``reasoning`` or ``general:{name}``,
``label_rows``) so the committed set can be counted by source.

General sources are SFT rows: ``{prompt, completion}`` columns (``field_map`` names them), or a chat column
(``field_map: {messages: messages}``, as ``HuggingFaceH4/ultrachat_200k`` has) whose last assistant turn
becomes the completion and the turns before it the prompt.
"""

from __future__ import annotations

import random
from typing import Any, Collection, Iterable, Sequence

from grpo_core.config import DatasetSource
from grpo_core.data.rows import DataError, LoadStats, load_sft_rows, read_records, to_messages

REASONING = "reasoning"


def load_general_rows(src: DatasetSource, *, on_error: str = "raise") -> list[dict[str, Any]]:
    """``{prompt, completion}`` rows of a general SFT source (a chat column when ``field_map`` maps ``messages``)."""
    if "messages" not in src.field_map:
        return load_sft_rows(src, on_error=on_error)[0]  # type: ignore[arg-type]
    column = src.field_map["messages"]
    stats = LoadStats()
    out = []
    for location, record in read_records(src.path, split=src.split, name=src.name, on_error=on_error,  # type: ignore[arg-type]
                                         stats=stats):
        if src.max_rows is not None and len(out) >= src.max_rows:
            break
        try:
            messages = to_messages(record.get(column))
            last = max((i for i, m in enumerate(messages) if m["role"] == "assistant"), default=-1)
            if last < 1 or not messages[last]["content"].strip():
                raise ValueError("has no assistant turn after a prompt turn")
        except ValueError as e:
            message = f"{location}: field 'messages' (column {column!r}) {e}"
            if on_error == "raise":
                raise DataError(message + ". Or set on_error: skip to skip and count bad rows.") from None
            stats.skip(message)
            continue
        out.append({"prompt": messages[:last], "completion": messages[last]["content"]})
    return out


def general_source_names(train_rows: Iterable[dict[str, Any]]) -> set[str]:
    """The sources of ``train_rows`` (prepare_data's prompts) none of whose rows has a reference answer: general
    prompts a reward model or judge scores (``answer_format: none``; ``grpo_core.data.general``'s built-in ones)."""
    answered: dict[str, bool] = {}
    for row in train_rows:
        if row.get("source") is not None:
            name = str(row["source"])
            answered[name] = answered.get(name, False) or bool(row.get("answer"))
    return {name for name, has_answer in answered.items() if not has_answer}


def label_rows(rows: Iterable[dict[str, Any]], general_row_sources: Collection[str] = ()) -> list[dict[str, Any]]:
    """``{prompt, completion, source}`` rows, ``source`` = ``general:{source}`` for a row of one of
    ``general_row_sources``, else ``reasoning`` (a row with no source was verified by a rule: reasoning); with
    ``tools`` too (``with_tools``) where a row has them (rejection sampling with tools)."""
    return with_tools([{"prompt": r["prompt"], "completion": r["completion"], "tools": r.get("tools"),
                        "source": f"general:{r['source']}" if r.get("source") in general_row_sources else REASONING}
                       for r in rows])


def with_tools(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """``rows`` with a ``tools`` key on every row (None where a row has none; parquet takes its columns from the
    first row) when any row has tools, else on none (a set sampled without tools is written as before)."""
    if any(r.get("tools") for r in rows):
        return [{**r, "tools": r.get("tools")} for r in rows]
    return [{k: v for k, v in r.items() if k != "tools"} for r in rows]


def count_by_source(rows: Iterable[dict[str, Any]]) -> dict[str, int]:
    """``{source: rows}`` of labelled rows."""
    counts: dict[str, int] = {}
    for row in rows:
        counts[row["source"]] = counts.get(row["source"], 0) + 1
    return counts


def mix_by_ratio(rows: Sequence[dict[str, Any]], general: dict[str, list[dict[str, Any]]], ratio: float, *,
                 seed: int = 0, general_row_sources: Collection[str] = ()
                 ) -> tuple[list[dict[str, Any]], dict[str, int]]:
    """``(rows, counts by source)``: reasoning and general rows at ``ratio`` reasoning rows per general row.

    ``rows`` are the set so far (rejection-sampled, cold-start); those whose ``source`` is in
    ``general_row_sources`` are general (``general:{source}``), the rest reasoning. ``general`` maps a general
    source's name to its rows. The general share is drawn (seeded) from one pool: the general rows of ``rows``
    and every row of ``general``.
    """
    if ratio <= 0:
        raise ValueError(f"ratio (reasoning rows per general row) must be > 0, got {ratio}")
    rng = random.Random(seed)
    labelled = label_rows(rows, general_row_sources)
    reasoning = [r for r in labelled if r["source"] == REASONING]
    pool = [r for r in labelled if r["source"] != REASONING]
    pool += [{"prompt": r["prompt"], "completion": r["completion"], "source": f"general:{name}"}
             for name, part in general.items() for r in part]
    n_general = round(len(reasoning) / ratio)
    if n_general > len(pool):  # too little general data: keep all of it, sample the reasoning rows down
        n_general = len(pool)
        reasoning = rng.sample(reasoning, min(len(reasoning), round(n_general * ratio)))
    mixed = with_tools(reasoning + rng.sample(pool, n_general))
    return mixed, count_by_source(mixed)
