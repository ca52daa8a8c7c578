"""The consolidation SFT set as R1 built it (sec. 2.3.3): rejection-sampled reasoning mixed with general data.

R1 fine-tuned on ~600k reasoning samples and ~200k non-reasoning ones (writing, factual QA, self-cognition,
translation), about 3:1. ``mix_by_ratio`` takes every kept reasoning row and ``round(n / ratio)`` general rows
(a seeded sample), so the counts match the ratio within one row; when the general pool is too small it takes
all of it and samples the reasoning rows down to ``round(general * ratio)`` instead. Every row carries a
``source`` column (``reasoning`` or ``general:{path}``) so the committed set can be counted by source.

General sources are SFT rows: ``{prompt, completion}`` columns (``field_map`` names them), or a chat column
(``field_map: {messages: messages}``, as ``HuggingFaceH4/ultrachat_200k`` has) whose last assistant turn
becomes the completion and the turns before it the prompt.
"""

from __future__ import annotations

import random
from typing import Any, Sequence

from grpo_core.config import DatasetSource
from grpo_core.data import DataError, LoadStats, load_sft_rows, read_records, to_messages


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


def mix_by_ratio(reasoning: Sequence[dict[str, Any]], general: dict[str, list[dict[str, Any]]], ratio: float, *,
                 seed: int = 0) -> tuple[list[dict[str, Any]], dict[str, int]]:
    """``(rows, counts by source)``: reasoning and general rows at ``ratio`` reasoning rows per general row.

    ``general`` maps a source name to its rows; the general share is drawn from their pool (seeded).
    """
    if ratio <= 0:
        raise ValueError(f"ratio (reasoning rows per general row) must be > 0, got {ratio}")
    rng = random.Random(seed)
    pool = [(name, row) for name, rows in general.items() for row in rows]
    reasoning = list(reasoning)
    n_general = round(len(reasoning) / ratio)
    if n_general > len(pool):  # too little general data: keep all of it, sample the reasoning rows down
        n_general = len(pool)
        reasoning = rng.sample(reasoning, min(len(reasoning), round(n_general * ratio)))
    picked = rng.sample(pool, n_general)
    rows = [{"prompt": r["prompt"], "completion": r["completion"], "source": "reasoning"} for r in reasoning]
    rows += [{"prompt": r["prompt"], "completion": r["completion"], "source": f"general:{name}"} for name, r in picked]
    counts: dict[str, int] = {}
    for row in rows:
        counts[row["source"]] = counts.get(row["source"], 0) + 1
    return rows, counts
