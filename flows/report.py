"""The run's report: the seed's emergence table measured for real, and plots of the GRPO stages.

    r1 report NAME        (also written at the end of every ``r1 run``)

Table rows: every model stage's held-out evaluation (greedy accuracy, pass@1 over k samples, mean
completion length, format rate), plus the GRPO stages' training curve at a few steps (the accuracy reward
and mean completion length of the sampled completions, on training prompts). Plots (PNG, matplotlib Agg)
of reward, accuracy and length over GRPO steps go to ``{root}/{run}/_report/`` next to ``report.md``;
inside a Prefect run the report is also a markdown artifact linking them.

"Emergence, measured" (``emergence_section``): the seed's phase table rebuilt from each evaluated stage's
measured response features (``grpo_core.emergence``: phase by ``phase_label``'s stated rule), and
``reflection.png``, reflection rate and accuracy over GRPO steps with the candidate "aha" step of each RL
stage marked by ``find_aha_step``'s stated rule.
"""

from __future__ import annotations

import json
import math
import re
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from grpo_core import emergence
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
    emergence: dict[str, Any] = field(default_factory=dict)


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
            "completions on training prompts at that step.",
            _markdown_table(rows),
            emergence_section(measured),
            *([f"## Benchmarks (R1 protocol)\nPer benchmark: pass@1 = mean correctness of n samples, pass@k "
                 f"(unbiased estimator), maj@k (majority over math-verify-equivalent answers), greedy accuracy; "
                 f"in percent, beside the published numbers the evaluate config's `reference` names.\n{bench}"]
              if (bench := benchmark_table(store, evaluations)) else []),
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
                                         "emergence": measured, "status": relative}, indent=2))
        store.put_file(json_path, f"{base}/report.json")
    _publish(run, markdown)
    return Report(run=run, uri=store.uri(f"{base}/report.md"), markdown=markdown, rows=rows, plots=uris,
                  emergence=measured)


# ---- Emergence, measured: the seed's phase table and the "aha" step ---------------------------------------
REFLECTION_KEY = "completions/reflection_rate"
# column -> evaluation key(s), the first present wins; features of the sampled held-out completions
MEASURED_COLUMNS = {"direct answers": ("eval/direct_rate",), "mean steps": ("eval/mean_steps",),
                    "reflection": ("eval/reflection_rate",), "backtracking": ("eval/backtrack_rate",),
                    "mean length": ("eval/mean_length_sampled", "eval/mean_length"), "pass@1": ("eval/pass@1",),
                    "accuracy with reflection": ("eval/accuracy_with_reflection",),
                    "accuracy without reflection": ("eval/accuracy_without_reflection",),
                    "greedy accuracy": ("eval/accuracy",)}
NOT_MEASURED = "not measured (evaluated before the emergence features existed; `r1 run` this run again)"


def measured_emergence(evaluations: dict[str, StageRef | None], histories: dict[str, list[dict[str, Any]]],
                       window: int = emergence.AHA_WINDOW, delta: float = emergence.AHA_DELTA) -> dict[str, Any]:
    """``{"rows": [...], "aha": {rl_stage: step | None}, "rules": {...}}``: one row per evaluated model stage
    with its phase and features; per RL stage, ``find_aha_step`` over its logged ``completions/reflection_rate``
    (a stage that logged none is absent from ``aha``)."""
    rows = []
    for stage, evaluation in evaluations.items():
        if evaluation is None:
            continue
        row: dict[str, Any] = {"stage": stage}
        for column, keys in MEASURED_COLUMNS.items():
            row[column] = _first(evaluation.metrics, keys)
        features = [row[c] for c in ("direct answers", "mean steps", "reflection", "backtracking")]
        row["phase"] = NOT_MEASURED if None in features else emergence.phase_label(*features)
        rows.append(row)
    aha = {}
    for stage, hist in histories.items():
        points = [(h["step"], h[REFLECTION_KEY]) for h in hist if h.get(REFLECTION_KEY) is not None]
        if points:
            aha[stage] = emergence.find_aha_step([s for s, _ in points], [v for _, v in points], window, delta)
    return {"rows": rows, "aha": aha, "rules": {"aha_window": window, "aha_delta": delta}}


def emergence_section(measured: dict[str, Any]) -> str:
    """The report's "Emergence, measured" section: the phase table, the rules, the aha verdict per RL stage."""
    window, delta = measured["rules"]["aha_window"], measured["rules"]["aha_delta"]
    columns = ["stage", "phase", *MEASURED_COLUMNS]
    lines = ["| " + " | ".join(columns) + " |", "|" + "---|" * len(columns)]
    for r in measured["rows"]:
        cells = [r["stage"], r["phase"]]
        for c in MEASURED_COLUMNS:
            v = r.get(c)
            cells.append("" if v is None else f"{v:.1f}" if c in ("mean steps", "mean length") else f"{100 * v:.1f}%")
        lines.append("| " + " | ".join(cells) + " |")
    aha = [f"- {stage}: candidate aha step **{step}**" if step is not None else
           f"- {stage}: no aha step found under the rule (window {window}, delta {delta})"
           for stage, step in measured["aha"].items()] or ["- no RL stage logged `completions/reflection_rate`"]
    return "\n\n".join([
        "## Emergence, measured\nThe seed's phases, read off each evaluated stage's sampled held-out completions "
        "(`grpo_core/emergence.py`): direct answers = share opening with an empty `<think></think>`; steps = "
        "non-empty pieces of the reasoning between line breaks, `;` and sentence ends; reflection / backtracking "
        "= share whose reasoning holds a phrase of the configured lists (`emergence.reflection_phrases` / "
        "`backtrack_phrases`: whole English words, Chinese anywhere, case-insensitive); mean length in tokens; "
        "accuracy split by whether the completion reflects.",
        "\n".join(lines),
        f"Phase rule (first that holds): direct answers >= {emergence.DIRECT_PHASE_MIN_DIRECT_RATE:.0%} or mean "
        f"steps < {emergence.LITTLE_REASONING_MAX_STEPS:g}: *{emergence.PHASES[0]}*; else reflection < "
        f"{emergence.SELF_CHECK_MIN_REFLECTION_RATE:.0%}: *{emergence.PHASES[1]}*; else backtracking < "
        f"{emergence.BACKTRACK_MIN_RATE:.0%}: *{emergence.PHASES[2]}*; else *{emergence.PHASES[3]}*.",
        f"Aha rule: over each RL stage's logged `{REFLECTION_KEY}` (the training samples of each step), m(t) is "
        f"the mean of the {window} steps ending at t; the first t where m(t) exceeds the lowest earlier m by more "
        f"than {delta} triggers, and the step marked is the first step of that window whose own reflection rate "
        f"is that far above the lowest m. [reflection.png](reflection.png) plots reflection rate and accuracy "
        f"against GRPO step with the marked step.\n" + "\n".join(aha),
    ])


def plot_reflection(histories: dict[str, list[dict[str, Any]]], aha: dict[str, int | None], out_dir: Path) -> Path:
    """reflection.png: reflection rate and accuracy reward per GRPO step (RL stages one after the other, as
    ``plot_histories``), a dashed line at each stage's candidate aha step."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    out_dir.mkdir(parents=True, exist_ok=True)
    fig, ax = plt.subplots(figsize=(6, 3.5), dpi=100)
    offset = 0
    for i, (stage, hist) in enumerate(histories.items()):
        for keys, style, label in (((REFLECTION_KEY,), "-", "reflection rate"), (ACCURACY_KEYS, ":", "accuracy reward")):
            points = [(offset + h["step"], _first(h, keys)) for h in hist]
            points = [(x, y) for x, y in points if y is not None]
            if points:
                ax.plot(*zip(*points), style, color=f"C{i}", marker="." if len(points) < 40 else None,
                        label=f"{stage} {label}")
        if aha.get(stage) is not None:
            ax.axvline(offset + aha[stage], color=f"C{i}", linestyle="--", label=f"{stage} aha? step {aha[stage]}")
        offset += max((h["step"] for h in hist), default=0)
    ax.set_xlabel("GRPO step (final_rl continues after grpo_train)")
    ax.set_ylabel("share of completions")
    ax.set_ylim(-0.02, 1.02)
    ax.grid(alpha=0.3)
    if ax.lines:
        ax.legend(fontsize="small")
    fig.tight_layout()
    path = out_dir / "reflection.png"
    fig.savefig(path)
    plt.close(fig)
    return path


def _publish(run: str, markdown: str) -> None:
    if not in_prefect_run():
        return
    try:
        from prefect.artifacts import create_markdown_artifact

        create_markdown_artifact(markdown, key=artifact_key(run, "report"), description=f"R1 report of run {run}")
    except Exception:  # noqa: BLE001 - the files in the store are the report; the artifact is a view
        pass

