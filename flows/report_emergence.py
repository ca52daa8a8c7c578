"""The report's "Emergence, measured" section: the seed's phase table rebuilt from each evaluated stage's
measured response features (``grpo_core.evaluation.emergence``: phase by ``phase_label``'s stated rule), and the
candidate "aha" step of each RL stage by ``find_aha_step``'s stated rule over its logged reflection rate."""

from __future__ import annotations

from typing import Any

from flows.report_tables import first_metric
from grpo_core.evaluation import emergence
from tasks.storage.manifest import StageRef

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
    (a stage that logged none is absent from ``aha``). Where more than one verifiable source was measured
    (``eval/{source}/reflection_rate``), each also has its own row, ``stage · source``, and each RL stage that
    logged ``completions/{source}/reflection_rate`` its own aha verdict: a task that checks its work should
    not be averaged with one that never does."""
    rows = []
    for stage, evaluation in evaluations.items():
        if evaluation is None:
            continue
        for label, prefix in [(stage, "eval/")] + [(f"{stage} · {src}", f"eval/{src}/")
                                                    for src in reasoning_sources(evaluation.metrics)]:
            row: dict[str, Any] = {"stage": label}
            for column, keys in MEASURED_COLUMNS.items():
                row[column] = first_metric(evaluation.metrics, tuple(k.replace("eval/", prefix, 1) for k in keys))
            features = [row[c] for c in ("direct answers", "mean steps", "reflection", "backtracking")]
            row["phase"] = NOT_MEASURED if None in features else emergence.phase_label(*features)
            rows.append(row)
    aha = {}
    for stage, hist in histories.items():
        keys = [(stage, REFLECTION_KEY)] + [(f"{stage} · {src}", f"completions/{src}/reflection_rate")
                                            for src in logged_sources(hist)]
        for label, key in keys:
            points = [(h["step"], h[key]) for h in hist if h.get(key) is not None]
            if points:
                aha[label] = emergence.find_aha_step([s for s, _ in points], [v for _, v in points], window, delta)
    return {"rows": rows, "aha": aha, "rules": {"aha_window": window, "aha_delta": delta}}


def logged_sources(hist: list[dict[str, Any]]) -> list[str]:
    """The sources an RL stage logged its own training reflection rate for (``completions/{source}/reflection_rate``:
    a step over several sources)."""
    return sorted({k.split("/")[1] for h in hist for k in h
                   if k.startswith("completions/") and k.endswith("/reflection_rate") and k.count("/") == 2})


def reasoning_sources(metrics: dict[str, Any]) -> list[str]:
    """The verifiable sources an evaluation measured one by one (``eval/{source}/reflection_rate``), when there
    are at least two; none otherwise (one source's row would repeat the stage's)."""
    names = sorted({k.split("/")[1] for k in metrics if k.count("/") == 2 and k.endswith("/reflection_rate")})
    return names if len(names) > 1 else []


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
        "(`grpo_core/evaluation/emergence.py`): direct answers = share opening with an empty `<think></think>`; steps = "
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
