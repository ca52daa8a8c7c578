"""The run's report: the seed's emergence table measured for real, and plots of the GRPO stages.

    r1 report NAME        (also written at the end of every ``r1 run``)

Table rows: every model stage's held-out evaluation (greedy accuracy, pass@1 over k samples, mean
completion length, format rate), plus the GRPO stages' training curve at a few steps (the accuracy reward
and mean completion length of the sampled completions, on training prompts). Plots (PNG, matplotlib Agg)
of reward, accuracy and length over GRPO steps go to ``{root}/{run}/_report/`` next to ``report.md``;
inside a Prefect run the report is also a markdown artifact linking them.
"""

from __future__ import annotations

import json
import math
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tasks.common import artifact_key, in_prefect_run
from tasks.evaluate import output_name as eval_output
from tasks.stages import all_stages
from tasks.manifest import StageRef
from tasks.store import Store
from tasks.training import read_history

REPORT_DIR = "_report"
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
PERCENT_COLUMNS = ("accuracy", "pass@1", "format rate", "forced-reasoning accuracy", "direct answers",
                   "preferred rate")


@dataclass
class Report:
    run: str
    uri: str
    markdown: str
    rows: list[dict[str, Any]]
    plots: dict[str, str]


def latest_refs(store: Store, run: str) -> dict[str, StageRef | None]:
    """Every stage's newest committed output (None where there is none)."""
    return {s.name: store.latest(run, s.name) for s in all_stages()}


def disabled_stages(store: Store, run: str) -> set[str]:
    """The optional stages the run's saved config does not enable (none when it has no readable config)."""
    from flows.stages import RUN_CONFIG
    from tasks.config import PipelineConfig

    saved = store.read_run_file(run, RUN_CONFIG)
    try:
        config = PipelineConfig.model_validate(saved["config"]) if saved else None
    except Exception:  # noqa: BLE001 - a config this code cannot read: show every stage as before
        return set()
    return {s.name for s in all_stages() if config is not None and not s.enabled(config)}


def evaluation_of(store: Store, ref: StageRef) -> StageRef | None:
    """The newest committed evaluation whose parent is exactly the model output ``ref``."""
    return store.latest(ref.run, eval_output(ref.stage),
                        where=lambda m: (m.get("parents") or {}).get("model", {}).get("version") == ref.version)


def latest_evaluations(store: Store, refs: dict[str, StageRef | None]) -> dict[str, StageRef | None]:
    """The evaluation of each committed model stage in ``refs`` (``evaluation_of``), read once per stage."""
    return {s.name: evaluation_of(store, refs[s.name]) for s in all_stages() if s.makes_model and refs[s.name]}


def stage_status(store: Store, run: str, refs: dict[str, StageRef | None] | None = None,
                 evaluations: dict[str, StageRef | None] | None = None) -> dict[str, Any]:
    """``{"run", "stages": {stage: {"state", "uri", "path", "metrics"}}}`` (state: completed | incomplete |
    pending | skipped (an optional stage the run's config does not enable); ``path`` store-relative, ``uri`` resolved in ``store``); a model stage's metrics include its
    evaluation's (``eval/...``), with ``eval_uri`` and ``eval_path``.

    ``refs``/``evaluations``: what the caller has already read (``latest_refs``, ``latest_evaluations``)."""
    refs = latest_refs(store, run) if refs is None else refs
    evaluations = latest_evaluations(store, refs) if evaluations is None else evaluations
    stages: dict[str, Any] = {}
    skipped = disabled_stages(store, run)
    for entry in all_stages():
        stage, ref = entry.name, refs[entry.name]
        if ref is None and stage in skipped:  # an optional stage this run's config does not run
            stages[stage] = {"state": "skipped", "uri": None, "path": None, "metrics": {}}
        elif ref is not None:
            stages[stage] = {"state": "completed", "uri": ref.uri, "path": ref.path, "metrics": dict(ref.metrics)}
            evaluation = evaluations.get(stage)
            if evaluation is not None:
                stages[stage]["metrics"].update(evaluation.metrics)
                stages[stage].update(eval_uri=evaluation.uri, eval_path=evaluation.path)
        else:
            pending = store.uncommitted(run, stage)
            stages[stage] = {"state": "incomplete" if pending else "pending", "uri": None, "path": None,
                             "metrics": {}}
    return {"run": run, "stages": stages}


def _first(metrics: dict[str, Any], keys: tuple[str, ...]) -> float | None:
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
        if entry.kind == "rl":
            hist = read_history(store, ref)
            histories[stage] = hist
            picks = sorted({hist[round(i * (len(hist) - 1) / max(1, curve_points - 1))]["step"]
                            for i in range(curve_points)}) if hist else []
            for h in (h for h in hist if h["step"] in picks):
                rows.append({"stage / step": f"{stage} step {h['step']} (train samples)",
                             "accuracy": _first(h, ACCURACY_KEYS), "mean length": _first(h, LENGTH_KEYS)})
        row = {"stage / step": f"{stage} (held-out)"}
        evaluation = evaluations.get(stage)
        for column, keys in EVAL_COLUMNS.items():
            row["accuracy" if column == "greedy accuracy" else column] = (
                _first(evaluation.metrics, keys) if evaluation is not None else None)
        rows.append(row)
    return rows, histories


def source_rows(evaluations: dict[str, StageRef | None], histories: dict[str, list[dict[str, Any]]]
                ) -> list[dict[str, Any]]:
    """Per-source numbers: each model stage's held-out ``eval/{source}/{metric}`` and each RL stage's
    ``rewards/{source}/mean`` at its last step; rows ``{"stage", "source", "metric", "value"}``."""
    rows = []
    for stage, evaluation in evaluations.items():
        for key, value in sorted((evaluation.metrics if evaluation else {}).items()):
            parts = key.split("/")
            if len(parts) == 3 and parts[0] == "eval":
                rows.append({"stage": f"{stage} (held-out)", "source": parts[1], "metric": parts[2], "value": value})
    for stage, hist in histories.items():
        last = hist[-1] if hist else {}
        sources = sorted(k.split("/")[1] for k in last if k.startswith("mixture/") and k.endswith("/prompts"))
        for source in sources:
            if f"rewards/{source}/mean" in last:
                rows.append({"stage": f"{stage} step {last['step']} (train samples)", "source": source,
                             "metric": "reward", "value": last[f"rewards/{source}/mean"]})
    return rows


def _markdown_table(rows: list[dict[str, Any]]) -> str:
    columns = ["stage / step", "accuracy", "pass@1", "mean length", "format rate", "forced-reasoning accuracy",
               "direct answers", "rm score", "preferred rate"]
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
                cells.append(f"{v:.2f}" if c == "rm score" else f"{v:.1f}")
            else:
                cells.append(str(v))
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def _source_table(rows: list[dict[str, Any]]) -> str:
    lines = ["| stage | source | metric | value |", "|---|---|---|---|"]
    lines += [f"| {r['stage']} | {r['source']} | {r['metric']} | "
              f"{r['value']:.4g} |" if isinstance(r["value"], (int, float)) else "" for r in rows]
    return "\n".join(lines)


def plot_histories(histories: dict[str, list[dict[str, Any]]], out_dir: Path) -> dict[str, Path]:
    """reward.png, accuracy.png, length.png: the RL stages one after the other on a shared step axis."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    out_dir.mkdir(parents=True, exist_ok=True)
    plots = {}
    for name, keys, label in (("reward", ("reward",), "mean reward"), ("accuracy", ACCURACY_KEYS, "accuracy reward"),
                              ("length", LENGTH_KEYS, "mean completion length (tokens)")):
        fig, ax = plt.subplots(figsize=(6, 3.5), dpi=100)
        offset = 0
        for stage, hist in histories.items():
            points = [(offset + h["step"], _first(h, keys)) for h in hist]
            points = [(x, y) for x, y in points if y is not None]
            if points:
                ax.plot(*zip(*points), marker="." if len(points) < 40 else None, label=stage)
            offset += max((h["step"] for h in hist), default=0)
        ax.set_xlabel("GRPO step (final_rl continues after grpo_train)")
        ax.set_ylabel(label)
        ax.grid(alpha=0.3)
        if ax.lines:
            ax.legend()
        fig.tight_layout()
        path = out_dir / f"{name}.png"
        fig.savefig(path)
        plt.close(fig)
        plots[name] = path
    return plots


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
        uris = {}
        for name, path in plots.items():
            store.put_file(path, f"{base}/{name}.png")
            uris[name] = store.uri(f"{base}/{name}.png")
        markdown = "\n\n".join([
            f"# R1 run `{run}`",
            "## Emergence table\nHeld-out rows: greedy accuracy, pass@1 over k samples at the eval temperature, mean "
            "completion length (tokens, greedy). GRPO rows: accuracy reward and mean length of the sampled "
            "completions on training prompts at that step.",
            _markdown_table(rows),
            "## By source\nEvery metric with a per-source meaning: held-out `eval/{source}/...` and the RL stages' "
            "mean reward of each source's sampled completions (`rewards/{source}/mean`) at their last step.",
            _source_table(by_source),
            "## Plots\n" + "\n".join(f"- [{name}]({name}.png)" for name in uris),
            "## Stages\n" + "\n".join(f"- {s}: {v['state']} {v['path'] or ''}" for s, v in status["stages"].items()),
        ])
        md_path = Path(tmp) / "report.md"
        md_path.write_text(markdown + "\n")
        store.put_file(md_path, f"{base}/report.md")
        json_path = Path(tmp) / "report.json"
        relative = {"run": run, "stages": {s: {k: v for k, v in info.items() if k not in ("uri", "eval_uri")}
                                           for s, info in status["stages"].items()}}
        json_path.write_text(json.dumps({"run": run, "rows": rows, "by_source": by_source,
                                         "plots": {name: f"{name}.png" for name in uris},
                                         "status": relative}, indent=2))
        store.put_file(json_path, f"{base}/report.json")
    _publish(run, markdown)
    return Report(run=run, uri=store.uri(f"{base}/report.md"), markdown=markdown, rows=rows, plots=uris)


def _publish(run: str, markdown: str) -> None:
    if not in_prefect_run():
        return
    try:
        from prefect.artifacts import create_markdown_artifact

        create_markdown_artifact(markdown, key=artifact_key(run, "report"), description=f"R1 report of run {run}")
    except Exception:  # noqa: BLE001 - the files in the store are the report; the artifact is a view
        pass

