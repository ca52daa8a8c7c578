"""The report's tables: the emergence table (held-out evaluations and GRPO curve points), benchmarks beside
their published numbers, and the per-source numbers. Rows are plain dicts (saved in ``report.json``);
the tables are markdown."""

from __future__ import annotations

import math
import re
from typing import Any

from flows.run_status import latest_evaluations, latest_refs
from tasks.config.stages import all_stages
from tasks.runner.training import read_history
from tasks.stages.evaluate import output_name as eval_output
from tasks.storage.manifest import StageRef
from tasks.storage.store import Store

# Which logged/eval keys mean what; the first one present wins.
ACCURACY_KEYS = ("rewards/chain_accuracy/mean", "rewards/math_accuracy/mean", "reward")
LENGTH_KEYS = ("completions/mean_length",)
EVAL_COLUMNS = {"greedy accuracy": ("eval/accuracy", "eval/greedy_accuracy"),
                "pass@1": ("eval/pass@1", "eval/pass_at_1"),
                "mean length": ("eval/mean_length", "eval/greedy_mean_length"),
                "format rate": ("eval/format_rate",),
                "forced-reasoning accuracy": ("eval/accuracy_forced_reasoning",),
                "direct answers": ("eval/direct_answer_rate",),
                "rm score": ("eval/rm_score",),
                "preferred rate": ("eval/preferred_rate",)}
# Tool use (issue 43; grpo_core.evaluation.tool_use), columns of the table only where a row has them, so a run without
# tools renders as before: held-out rows read the greedy completions' rates, GRPO rows the step's rollouts (which log
# calls and errors per trajectory, no call rate)
TOOL_COLUMNS = {"tool-call rate": ("eval/tools/call_rate",), "calls per answer": ("eval/tools/calls_per_response",),
                "tool error rate": ("eval/tools/error_rate",)}
TOOL_RATES = ("call_rate", "calls_per_response", "error_rate")  # eval/tools/{rate}, eval/{source}/tools/{rate}
TRAIN_TOOL_COLUMNS = {"calls per answer": ("tools/calls_mean",), "tool error rate": ("tools/error_rate",)}
PERCENT_COLUMNS = ("accuracy", "pass@1", "format rate", "forced-reasoning accuracy", "direct answers",
                   "preferred rate", "tool-call rate", "tool error rate")


def first_metric(metrics: dict[str, Any], keys: tuple[str, ...]) -> float | None:
    """The value of the first of ``keys`` that ``metrics`` holds as a number (None and NaN count as absent)."""
    for k in keys:
        if k in metrics and metrics[k] is not None and not (isinstance(metrics[k], float) and math.isnan(metrics[k])):
            return float(metrics[k])
    return None


def emergence_rows(store: Store, run: str, curve_points: int = 5, refs: dict[str, StageRef | None] | None = None,
                   evaluations: dict[str, StageRef | None] | None = None
                   ) -> tuple[list[dict[str, Any]], dict[str, list]]:
    """Table rows (held-out evals and RL curve points) and the RL stages' histories used for the plots."""
    refs = latest_refs(store, run) if refs is None else refs
    evaluations = latest_evaluations(store, refs) if evaluations is None else evaluations
    rows: list[dict[str, Any]] = []
    histories: dict[str, list[dict[str, Any]]] = {}
    for entry in all_stages():
        stage = entry.name
        ref = refs[stage] if entry.makes_model else None
        if ref is None:
            continue
        if entry.kind == "grpo":
            hist = read_history(store, ref)
            histories[stage] = hist
            picks = sorted({hist[round(i * (len(hist) - 1) / max(1, curve_points - 1))]["step"]
                            for i in range(curve_points)}) if hist else []
            for h in (h for h in hist if h["step"] in picks):
                rows.append({"stage / step": f"{stage} step {h['step']} (train samples)",
                             "accuracy": first_metric(h, ACCURACY_KEYS), "mean length": first_metric(h, LENGTH_KEYS),
                             **tool_use(h, TRAIN_TOOL_COLUMNS)})
        row = {"stage / step": f"{stage} (held-out)"}
        evaluation = evaluations.get(stage)
        for column, keys in EVAL_COLUMNS.items():
            row["accuracy" if column == "greedy accuracy" else column] = (
                first_metric(evaluation.metrics, keys) if evaluation is not None else None)
        rows.append({**row, **(tool_use(evaluation.metrics, TOOL_COLUMNS) if evaluation is not None else {})})
    return rows, histories


def tool_use(metrics: dict[str, Any], columns: dict[str, tuple[str, ...]]) -> dict[str, float]:
    """The tool-use columns ``metrics`` holds (``TOOL_COLUMNS``, ``TRAIN_TOOL_COLUMNS``); none without tools, so a
    row of a run without tools has the keys it had before."""
    return {column: value for column, keys in columns.items() if (value := first_metric(metrics, keys)) is not None}


def tool_columns(rows: list[dict[str, Any]], columns: dict[str, tuple[str, ...]] = TOOL_COLUMNS) -> list[str]:
    """The tool-use columns some row has, in ``columns``' order: none in a run without tools."""
    return [c for c in columns if any(r.get(c) is not None for r in rows)]


def emergence_table(rows: list[dict[str, Any]]) -> str:
    """The markdown of ``emergence_rows``' rows: shares in percent, the rm score and calls per answer to two
    decimals; the tool-use columns only where a row has them (``tool_columns``)."""
    columns = ["stage / step", "accuracy", "pass@1", "mean length", "format rate", "forced-reasoning accuracy",
               "direct answers", "rm score", "preferred rate", *tool_columns(rows)]
    lines = ["| " + " | ".join(columns) + " |", "|" + "---|" * len(columns)]
    for r in rows:
        cells = []
        for c in columns:
            v = r.get(c)
            if v is None:
                cells.append("")
            elif c in PERCENT_COLUMNS:
                cells.append(f"{100 * v:.1f}%")
            elif isinstance(v, float):
                cells.append(f"{v:.2f}" if c in ("rm score", "calls per answer") else f"{v:.1f}")
            else:
                cells.append(str(v))
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def source_rows(evaluations: dict[str, StageRef | None], histories: dict[str, list[dict[str, Any]]]
                ) -> list[dict[str, Any]]:
    """Per-source numbers: each model stage's held-out ``eval/{source}/{metric}`` (with tools also
    ``eval/{source}/tools/{rate}``, metric ``tools/{rate}``; the stage's own ``eval/tools/{rate}`` is no source's) and
    each RL stage's ``rewards/{source}/mean`` at its last step; rows ``{"stage", "source", "metric", "value"}``."""
    rows = []
    for stage, evaluation in evaluations.items():
        for key, value in sorted((evaluation.metrics if evaluation else {}).items()):
            parts = key.split("/")
            if len(parts) == 4 and parts[0] == "eval" and parts[2] == "tools":  # a source's tool use
                parts = [parts[0], parts[1], f"tools/{parts[3]}"]
            elif parts[:2] == ["eval", "tools"] and parts[-1].removesuffix("_sampled") in TOOL_RATES:
                continue  # the stage's own tool use: the emergence table's columns
            if len(parts) == 3 and parts[0] == "eval" and not BENCHMARK_METRIC.match(key):  # benchmarks: own table
                rows.append({"stage": f"{stage} (held-out)", "source": parts[1], "metric": parts[2], "value": value})
    for stage, hist in histories.items():
        last = hist[-1] if hist else {}
        sources = sorted(k.split("/")[1] for k in last if k.startswith("mixture/") and k.endswith("/prompts"))
        for source in sources:
            if f"rewards/{source}/mean" in last:
                rows.append({"stage": f"{stage} step {last['step']} (train samples)", "source": source,
                             "metric": "reward", "value": last[f"rewards/{source}/mean"]})
    return rows


def source_table(rows: list[dict[str, Any]]) -> str:
    """The markdown of ``source_rows``' rows."""
    lines = ["| stage | source | metric | value |", "|---|---|---|---|"]
    lines += [f"| {r['stage']} | {r['source']} | {r['metric']} | "
              + (f"{r['value']:.4g}" if isinstance(r["value"], (int, float)) else str(r["value"])) + " |" for r in rows]
    return "\n".join(lines)


# ---------------------------------------------------------------- benchmarks beside published numbers

BENCHMARK_METRIC = re.compile(r"^eval/(?P<bench>[^/]+)/(?P<metric>pass@\d+|maj@\d+|greedy)$")


def _metric_order(metric: str) -> tuple[int, int]:
    kind, _, k = metric.partition("@")
    return ({"pass": 0, "maj": 1}.get(kind, 2), int(k) if k else 0)


def benchmark_table(store: Store, evaluations: dict[str, StageRef | None]) -> str:
    """Markdown: per benchmark, one row per evaluated stage (pass@1, pass@k, maj@k, greedy in percent) and a
    row of the published numbers the evaluation's config names (``evaluate.reference``), then the last
    stage's distance to them in points. Empty when no evaluation scored a benchmark."""
    numbers: dict[str, dict[str, dict[str, float]]] = {}  # benchmark -> stage -> metric -> value
    references: dict[str, dict[str, float | str]] = {}
    for stage, ref in evaluations.items():
        if ref is None:
            continue
        for key, value in ref.metrics.items():
            if (m := BENCHMARK_METRIC.match(key)) is not None:
                numbers.setdefault(m["bench"], {}).setdefault(stage, {})[m["metric"]] = 100 * float(value)
        if any(BENCHMARK_METRIC.match(k) for k in ref.metrics):
            section = store.manifest(ref).get("config", {}).get(eval_output(stage), {})
            references.update(section.get("reference") or {})
    if not numbers:
        return ""
    lines = []
    for bench, stages in numbers.items():
        reference = references.get(bench, {})
        metrics = sorted({m for values in stages.values() for m in values}
                         | {m for m in reference if m != "label"}, key=_metric_order)
        lines += [f"\n**{bench}**\n", "| benchmark | model | " + " | ".join(metrics) + " |",
                  "|" + "---|" * (len(metrics) + 2)]
        for stage, values in stages.items():
            lines.append(f"| {bench} | {stage} | " + " | ".join(_pct(values.get(m)) for m in metrics) + " |")
        if reference:
            label = f"{reference.get('label', 'published')} (reference)"
            lines.append(f"| {bench} | {label} | " + " | ".join(_pct(reference.get(m)) for m in metrics) + " |")
            last, values = list(stages.items())[-1]
            gaps = [None if not isinstance(reference.get(m), (int, float)) or m not in values
                    else values[m] - float(reference[m]) for m in metrics]
            lines.append(f"| {bench} | {last} minus reference | "
                         + " | ".join("" if g is None else f"{g:+.1f} pts" for g in gaps) + " |")
    return "\n".join(lines)


def _pct(value: Any) -> str:
    return f"{float(value):.1f}%" if isinstance(value, (int, float)) else ""
