"""The run's report: the seed's emergence table measured for real, and plots of the GRPO stages.

    r1 report NAME        (also written at the end of every ``r1 run``)

Table rows: every model stage's held-out evaluation (greedy accuracy, pass@1 over k samples, mean
completion length, format rate), plus the GRPO stages' training curve at a few steps (the accuracy reward
and mean completion length of the sampled completions, on training prompts). Plots (PNG, matplotlib Agg)
of reward, accuracy and length over GRPO steps go to ``{root}/{run}/_report/`` next to ``report.md``;
inside a Prefect run the report is also a markdown artifact linking them.

"Emergence, measured" (``emergence_section``): the seed's phase table rebuilt from each evaluated stage's
measured response features (``grpo_core.evaluation.emergence``: phase by ``phase_label``'s stated rule), and
``reflection.png``, reflection rate and accuracy over GRPO steps with the candidate "aha" step of each RL
stage marked by ``find_aha_step``'s stated rule.

This module lays the report out and saves it; the sections live beside it: ``flows/report_tables.py``
(emergence table, benchmarks, by source), ``flows/report_emergence.py`` (phases and the aha rule),
``flows/report_plots.py`` (the PNGs), and ``flows/run_status.py`` (the stages' state, also ``r1 status``).
"""

from __future__ import annotations

import json
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from flows.report_emergence import emergence_section, measured_emergence
from flows.report_plots import plot_histories, plot_reflection
from flows.report_tables import (benchmark_table, emergence_rows, emergence_table, source_rows, source_table,
                                 tool_columns)
from flows.run_status import latest_evaluations, latest_refs, stage_status
from tasks.runner.common import artifact_key, in_prefect_run
from tasks.runner.monitor import status_lines
from tasks.storage.store import Store

REPORT_DIR = "_report"


@dataclass
class Report:
    run: str
    uri: str
    markdown: str
    rows: list[dict[str, Any]]
    plots: dict[str, str]
    emergence: dict[str, Any] = field(default_factory=dict)


def write_report(store: Store, run: str) -> Report:
    """Build the table and plots from the committed stages, save them to the store, publish an artifact.
    What is saved refers to the store's files by relative paths (plots beside the report, stages as
    ``run/stage/version``), so the report stays right when the store is copied or moved."""
    refs = latest_refs(store, run)  # read once, for the table and the stage list
    evaluations = latest_evaluations(store, refs)
    rows, histories = emergence_rows(store, run, refs=refs, evaluations=evaluations)
    status = stage_status(store, run, refs, evaluations)
    by_source = source_rows(evaluations, histories)
    base = store.path(run, REPORT_DIR)
    with tempfile.TemporaryDirectory(prefix="r1-report-") as tmp:
        plots = plot_histories(histories, Path(tmp))
        measured = measured_emergence(evaluations, histories)
        plots["reflection"] = plot_reflection(histories, measured["aha"], Path(tmp))
        uris = {}
        for name, path in plots.items():
            store.put_file(path, f"{base}/{name}.png")
            uris[name] = store.uri(f"{base}/{name}.png")
        markdown = "\n\n".join([
            f"# R1 run `{run}`",
            "## Emergence table\nHeld-out rows: greedy accuracy, pass@1 over k samples at the eval temperature, mean "
            "completion length (tokens, greedy). GRPO rows: accuracy reward and mean length of the sampled "
            "completions on training prompts at that step." + (
                " Tool use (`sampling.tools`): tool-call rate = share of the greedy held-out completions with a "
                "tool call answered, calls per answer = tool calls answered per completion (GRPO rows: per "
                "rollout), tool error rate = error turns per call." if tool_columns(rows) else ""),
            emergence_table(rows),
            emergence_section(measured),
            *([f"## Benchmarks (R1 protocol)\nPer benchmark: pass@1 = mean correctness of n samples, pass@k "
                 f"(unbiased estimator), maj@k (majority over math-verify-equivalent answers), greedy accuracy; "
                 f"in percent, beside the published numbers the evaluate config's `reference` names.\n{bench}"]
              if (bench := benchmark_table(store, evaluations)) else []),
            "## By source\nEvery metric with a per-source meaning: held-out `eval/{source}/...` and the RL stages' "
            "mean reward of each source's sampled completions (`rewards/{source}/mean`) at their last step.",
            source_table(by_source),
            "## Plots\n" + "\n".join(f"- [{name}]({name}.png)" for name in uris),
            "## Stages\n" + "\n".join(f"- {s}: {v['state']} {v['path'] or ''}" for s, v in status["stages"].items()),
            *([f"## Reward-hacking monitor\nEvery `eval_steps`, the general sources' held-out rows scored by the "
               f"training reward (the proxy) and a held-out signal it is not trained on (`monitor/{{source}}/...`).\n"
               + "\n".join(f"- {line}" for line in monitor)] if (monitor := [
                  line for s, v in status["stages"].items() for line in status_lines(s, v["metrics"])]) else []),
        ])
        md_path = Path(tmp) / "report.md"
        md_path.write_text(markdown + "\n")
        store.put_file(md_path, f"{base}/report.md")
        json_path = Path(tmp) / "report.json"
        relative = {"run": run, "stages": {s: {k: v for k, v in info.items() if k not in ("uri", "eval_uri")}
                                           for s, info in status["stages"].items()}}
        json_path.write_text(json.dumps({"run": run, "rows": rows, "by_source": by_source,
                                         "plots": {name: f"{name}.png" for name in uris},
                                         "emergence": measured, "status": relative}, indent=2))
        store.put_file(json_path, f"{base}/report.json")
    _publish(run, markdown)
    return Report(run=run, uri=store.uri(f"{base}/report.md"), markdown=markdown, rows=rows, plots=uris,
                  emergence=measured)


def _publish(run: str, markdown: str) -> None:
    if not in_prefect_run():
        return
    try:
        from prefect.artifacts import create_markdown_artifact

        create_markdown_artifact(markdown, key=artifact_key(run, "report"), description=f"R1 report of run {run}")
    except Exception:  # noqa: BLE001 - the files in the store are the report; the artifact is a view
        pass

