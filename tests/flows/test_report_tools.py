"""The report's tool use (issue 43): with ``sampling.tools`` an evaluation reports ``eval/tools/call_rate``,
``calls_per_response`` and ``error_rate`` (``_sampled`` over the sampled completions, ``eval/{source}/tools/...`` per
source), and the emergence table, the "Emergence, measured" table and the per-source table show them; a run without
tools renders exactly as before (the tool columns exist only where a row has a tool key). Metrics dicts, no run."""

from __future__ import annotations

import json
import math
import re
from pathlib import Path
from types import SimpleNamespace

from flows.report import write_report
from flows.report_emergence import emergence_section, measured_emergence
from flows.report_tables import emergence_rows, emergence_table, source_rows
from tasks.stages.evaluate import output_name
from tasks.storage.store import Store

RUN = "emerge"
TABLE_HEADER = ("| stage / step | accuracy | pass@1 | mean length | format rate | forced-reasoning accuracy | "
                "direct answers | rm score | preferred rate |")  # the emergence table's columns before tool use


def _eval(accuracy: float, reflection: float) -> dict[str, float]:
    return {"eval/accuracy": accuracy, "eval/pass@1": accuracy, "eval/mean_length": 40.0,
            "eval/mean_length_sampled": 44.0, "eval/direct_rate": 0.0, "eval/mean_steps": 4.0,
            "eval/reflection_rate": reflection, "eval/backtrack_rate": 0.0, "eval/accuracy_with_reflection": 0.5,
            "eval/accuracy_without_reflection": accuracy, "eval/format_rate": 0.9}


def _tools(call_rate: float, calls: float, errors: float, prefix: str = "eval/") -> dict[str, float]:
    """What evaluation adds with tools: the greedy completions' rates and the sampled ones' (``_sampled``)."""
    greedy = {"tools/call_rate": call_rate, "tools/calls_per_response": calls, "tools/error_rate": errors}
    sampled = {f"{k}_sampled": v / 2 for k, v in greedy.items()}
    return {f"{prefix}{k}": v for k, v in {**greedy, **sampled}.items()}


def _history(path: Path, tools: bool) -> Path:
    rows = [{"step": s, "reward": 0.1 * s, "rewards/math_accuracy/mean": 0.1 * s, "completions/mean_length": 30.0,
             "completions/reflection_rate": 0.1,
             **({"tools/calls_mean": 0.25 * s, "tools/error_rate": 0.5, "tools/turns_mean": 1.0 + 0.25 * s}
                if tools else {})} for s in range(1, 5)]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def _store(tmp_path: Path, tools: bool) -> Store:
    """cold_start_sft and grpo_train, each evaluated; with ``tools`` their evaluations and GRPO log carry tool use."""
    store = Store(tmp_path / ("with" if tools else "without"))
    evals = {"cold_start_sft": {**_eval(0.2, 0.0), **(_tools(0.05, 0.05, math.nan) if tools else {})},
             "grpo_train": {**_eval(0.6, 0.3), **(_tools(0.8, 1.25, 0.1) if tools else {})}}
    for stage, metrics in evals.items():
        files = {"metrics.jsonl": _history(tmp_path / f"{stage}-{tools}.jsonl", tools)} if stage == "grpo_train" else {}
        writer = store.begin(RUN, stage)
        for name, path in files.items():
            writer.put_file(path, name)
        ref = writer.commit(fingerprint=stage, config={}, parents={}, metrics={})
        store.begin(RUN, output_name(stage)).commit(fingerprint=stage, config={}, parents={"model": ref},
                                                     metrics=metrics)
    return store


def _without_columns(table: str, names: list[str]) -> str:
    """``table`` (markdown) with the named columns removed."""
    lines = table.splitlines()
    header = [c.strip() for c in lines[0].strip("|").split("|")]
    keep = [i for i, c in enumerate(header) if c not in names]
    out = []
    for line in lines:
        cells = line.strip().removeprefix("|").removesuffix("|").split("|")
        out.append("|" + "|".join(cells[i] for i in keep) + "|")
    return "\n".join(out)


def test_the_emergence_table_gains_tool_columns_and_a_run_without_tools_renders_as_before(tmp_path):
    with_tools, _ = emergence_rows(_store(tmp_path, True), RUN)
    without, _ = emergence_rows(_store(tmp_path, False), RUN)
    table, plain = emergence_table(with_tools), emergence_table(without)

    assert plain.splitlines()[0] == TABLE_HEADER  # no tool key: the columns of before, rows with the keys of before
    assert all(not any("tool" in k or k == "calls per answer" for k in r) for r in without)
    assert table.splitlines()[0] == TABLE_HEADER + " tool-call rate | calls per answer | tool error rate |"
    rows = {line.split(" | ")[0].lstrip("| "): line for line in table.splitlines()[2:]}
    assert rows["grpo_train (held-out)"].endswith("| 80.0% | 1.25 | 10.0% |")  # the greedy completions' rates
    assert rows["cold_start_sft (held-out)"].endswith("| 5.0% | 0.05 |  |")  # no call errs: NaN, an empty cell
    assert rows["grpo_train step 4 (train samples)"].endswith("|  | 1.00 | 50.0% |")  # the step's rollouts
    # the same table with the tool columns taken out is the one a run without tools renders
    no_tool_cols = _without_columns(table, ["tool-call rate", "calls per answer", "tool error rate"])
    assert no_tool_cols == _without_columns(plain, [])


def test_the_measured_emergence_table_and_sources_read_the_sampled_tool_use_per_source():
    metrics = {**_eval(0.6, 0.3), **_tools(0.8, 1.25, 0.1),
               **{k.replace("eval/", "eval/gsm8k/", 1): v for k, v in {**_eval(0.7, 0.4), **_tools(0.9, 1.5, 0.2)}.items()},
               **{k.replace("eval/", "eval/calc/", 1): v for k, v in {**_eval(0.5, 0.2), **_tools(0.6, 1.0, 0.0)}.items()}}
    measured = measured_emergence({"grpo_train": SimpleNamespace(metrics=metrics)}, {})
    rows = {r["stage"]: r for r in measured["rows"]}
    assert rows["grpo_train"]["tool-call rate"] == 0.4  # the sampled completions', as the other features
    assert rows["grpo_train · gsm8k"]["calls per answer"] == 0.75 and rows["grpo_train · calc"]["tool error rate"] == 0.0
    md = emergence_section(measured)
    assert "| reflection after a hit | tool-call rate | calls per answer | tool error rate |" in md
    assert re.search(r"\| grpo_train · gsm8k \|.*\| 45\.0% \| 0\.75 \| 10\.0% \|$", md, re.MULTILINE)
    assert "Tool use (`sampling.tools`) over the same completions" in md

    plain = {k: v for k, v in metrics.items() if "/tools/" not in k}
    plain_md = emergence_section(measured_emergence({"grpo_train": SimpleNamespace(metrics=plain)}, {}))
    assert "tool" not in plain_md.lower()
    assert _without_columns(md.split("\n\n")[1], ["tool-call rate", "calls per answer", "tool error rate"]) == \
        _without_columns(plain_md.split("\n\n")[1], [])
    assert md.replace(md.split("\n\n")[1], "").replace(
        " Tool use (`sampling.tools`) over the same completions: tool-call rate = share with at least one tool call "
        "answered, calls per answer = tool calls answered per completion, tool error rate = error turns per call.",
        "") == plain_md.replace(plain_md.split("\n\n")[1], "")

    by_source = source_rows({"grpo_train": SimpleNamespace(metrics=metrics)}, {})
    assert {"stage": "grpo_train (held-out)", "source": "gsm8k", "metric": "tools/call_rate", "value": 0.9} in by_source
    assert not any(r["source"] == "tools" for r in by_source)  # the stage's eval/tools/... is no source
    assert source_rows({"grpo_train": SimpleNamespace(metrics=plain)}, {}) == [
        r for r in by_source if not r["metric"].startswith("tools/")]


def test_the_written_report_of_a_run_without_tools_has_no_tool_text(tmp_path):
    plain = write_report(_store(tmp_path, False), RUN).markdown
    assert "tool" not in plain.lower() and TABLE_HEADER in plain
    md = write_report(_store(tmp_path, True), RUN).markdown
    assert "| tool-call rate | calls per answer | tool error rate |" in md
    assert "Tool use (`sampling.tools`): tool-call rate = share of the greedy held-out completions" in md
