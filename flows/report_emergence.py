"""The report's "Emergence, measured" section: the seed's phase table rebuilt from each evaluated stage's
measured response features (``grpo_core.evaluation.emergence``: phase by ``phase_label``'s stated rule), and the
candidate "aha" step of each RL stage by ``find_aha_step``'s stated rule over its logged reflection rate (a
source's checking rate where it logged one), with the accuracy change over the rise beside it."""

from __future__ import annotations

from typing import Any

from flows.report_tables import ACCURACY_KEYS, first_metric, tool_columns
from grpo_core.evaluation import emergence
from tasks.storage.manifest import StageRef

REFLECTION_KEY = "completions/reflection_rate"
# column -> evaluation key(s), the first present wins; features of the sampled held-out completions
MEASURED_COLUMNS = {"direct answers": ("eval/direct_rate",), "mean steps": ("eval/mean_steps",),
                    "reflection": ("eval/reflection_rate",), "backtracking": ("eval/backtrack_rate",),
                    "mean length": ("eval/mean_length_sampled", "eval/mean_length"), "pass@1": ("eval/pass@1",),
                    "accuracy with reflection": ("eval/accuracy_with_reflection",),
                    "accuracy without reflection": ("eval/accuracy_without_reflection",),
                    "greedy accuracy": ("eval/accuracy",),
                    # a task with tries (countdown; grpo_core.evaluation.checking), empty for one without: responses
                    # that check a miss and retry; of the missed tries, those checked and retried; of the tries that
                    # hit, those the response stops on; first tries and tries right after a miss that hit; responses
                    # with a reflection phrase after a try that hit (a check that cannot pay)
                    "checking": ("eval/checking_rate",), "misses checked & retried": ("eval/miss_retry_rate",),
                    "hits that stop": ("eval/hit_stop_rate",), "first tries hit": ("eval/first_try_hit_rate",),
                    "retries hit": ("eval/retry_hit_rate",),
                    "reflection after a hit": ("eval/reflection_after_hit_rate",)}
# tool use over the same sampled completions (the greedy ones' where no sample was drawn), per source too; columns of
# the table only where a row has them, so a run without tools renders as before
TOOL_COLUMNS = {"tool-call rate": ("eval/tools/call_rate_sampled", "eval/tools/call_rate"),
                "calls per answer": ("eval/tools/calls_per_response_sampled", "eval/tools/calls_per_response"),
                "tool error rate": ("eval/tools/error_rate_sampled", "eval/tools/error_rate")}
NOT_MEASURED = "not measured (evaluated before the emergence features existed; `r1 run` this run again)"


def measured_emergence(evaluations: dict[str, StageRef | None], histories: dict[str, list[dict[str, Any]]]
                       ) -> dict[str, Any]:
    """``{"rows": [...], "aha": {rl_stage: step | None}, "aha_detail": {rl_stage: {...}}, "rules": {...}}``: one
    row per evaluated model stage with its phase and features; per RL stage, ``find_aha_step`` over its logged
    ``completions/reflection_rate`` (a stage that logged none is absent from ``aha``), with what it read and the
    accuracy change over the rise in ``aha_detail`` (``stage_aha``). Where more than one verifiable source was
    measured (``eval/{source}/reflection_rate``), each also has its own row, ``stage · source``, and each RL stage
    that logged ``completions/{source}/reflection_rate`` its own aha verdict (on its checking rate where logged):
    a task that checks its work should not be averaged with one that never does."""
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
            for column, keys in TOOL_COLUMNS.items():  # only where measured: a row without tools keeps its keys
                value = first_metric(evaluation.metrics, tuple(k.replace("eval/", prefix, 1) for k in keys))
                if value is not None:
                    row[column] = value
            rows.append(row)
    detail = {}
    for stage, hist in histories.items():
        for label, src in [(stage, None)] + [(f"{stage} · {src}", src) for src in logged_sources(hist)]:
            verdict = stage_aha(hist, src)
            if verdict is not None:
                detail[label] = verdict
    return {"rows": rows, "aha": {label: d["step"] for label, d in detail.items()}, "aha_detail": detail,
            "rules": dict(AHA_RULES)}


# find_aha_step's constants, as the report states them
AHA_RULES = {"aha_baseline": emergence.AHA_BASELINE, "aha_window": emergence.AHA_WINDOW, "aha_z": emergence.AHA_Z,
             "aha_min_rise": emergence.AHA_MIN_RISE, "aha_persist": emergence.AHA_PERSIST,
             "aha_default_count": emergence.AHA_DEFAULT_COUNT}


def aha_curve(hist: list[dict[str, Any]], src: str | None) -> str:
    """The curve an aha verdict reads: the checking rate (``completions/checking_rate``, a source's
    ``completions/{src}/checking_rate``: a missed try followed by a check and another try) where it was logged (a
    task with tries), else the reflection rate (``completions/reflection_rate``, ``completions/{src}/...``)."""
    prefix = "completions/" if src is None else f"completions/{src}/"
    checking = f"{prefix}checking_rate"
    return checking if any(h.get(checking) is not None for h in hist) else f"{prefix}reflection_rate"


def accuracy_key(hist: list[dict[str, Any]], src: str | None) -> str | None:
    """The per-step accuracy read beside an aha step, the first logged of: for a source its own
    (``completions/{src}/accuracy``, ``completions/{src}/reward``, ``rewards/{src}_accuracy/mean``), then the
    stage's (``completions/accuracy``, ``ACCURACY_KEYS``: the step's ``reward`` last)."""
    own = () if src is None else (f"completions/{src}/accuracy", f"completions/{src}/reward",
                                  f"rewards/{src}_accuracy/mean")
    keys = (*own, "completions/accuracy", *ACCURACY_KEYS)
    return next((k for k in keys if any(first_metric(h, (k,)) is not None for h in hist)), None)


def stage_aha(hist: list[dict[str, Any]], src: str | None) -> dict[str, Any] | None:
    """``emergence.aha_verdict`` over one RL stage's history (``src``: one source of it, else the whole step),
    each step's rate over its logged ``completions/count`` (``completions/{src}/count``; the rule's default where
    not logged): ``{"step", "curve", "p0", "rise", "accuracy", "accuracy_change"}``; None when the curve was never
    logged."""
    curve = aha_curve(hist, src)
    rows = [h for h in hist if h.get(curve) is not None]
    if not rows:
        return None
    count = "completions/count" if src is None else f"completions/{src}/count"
    acc = accuracy_key(hist, src)
    v = emergence.aha_verdict([h["step"] for h in rows], [h[curve] for h in rows], [h.get(count) for h in rows],
                              None if acc is None else [first_metric(h, (acc,)) for h in rows])
    return {"step": v.step, "curve": curve, "p0": None if v.p0 != v.p0 else v.p0,
            "rise": None if v.rise is None else list(v.rise), "accuracy": acc, "accuracy_change": v.accuracy_change}


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
    tools = tool_columns(measured["rows"], TOOL_COLUMNS)
    columns = ["stage", "phase", *MEASURED_COLUMNS, *tools]
    lines = ["| " + " | ".join(columns) + " |", "|" + "---|" * len(columns)]
    for r in measured["rows"]:
        cells = [r["stage"], r["phase"]]
        for c in (*MEASURED_COLUMNS, *tools):
            v = r.get(c)
            cells.append("" if v is None else f"{v:.1f}" if c in ("mean steps", "mean length") else
                         f"{v:.2f}" if c == "calls per answer" else f"{100 * v:.1f}%")
        lines.append("| " + " | ".join(cells) + " |")
    details = measured.get("aha_detail", {})
    aha = [aha_line(label, step, details.get(label, {}), measured["rules"]) for label, step in measured["aha"].items()]
    aha = aha or ["- no RL stage logged `completions/reflection_rate`"]
    return "\n\n".join([
        "## Emergence, measured\nThe seed's phases, read off each evaluated stage's sampled held-out completions "
        "(`grpo_core/evaluation/emergence.py`): direct answers = share opening with an empty `<think></think>`; steps = "
        "non-empty pieces of the reasoning between line breaks, `;` and sentence ends; reflection / backtracking "
        "= share whose reasoning holds a phrase of the configured lists (`emergence.reflection_phrases` / "
        "`backtrack_phrases`: whole English words, Chinese anywhere, case-insensitive); mean length in tokens; "
        "accuracy split by whether the completion reflects." + (
            " Tool use (`sampling.tools`) over the same completions: tool-call rate = share with at least one tool "
            "call answered, calls per answer = tool calls answered per completion, tool error rate = error turns "
            "per call." if tools else ""),
        "\n".join(lines),
        f"Phase rule (first that holds): direct answers >= {emergence.DIRECT_PHASE_MIN_DIRECT_RATE:.0%} or mean "
        f"steps < {emergence.LITTLE_REASONING_MAX_STEPS:g}: *{emergence.PHASES[0]}*; else reflection < "
        f"{emergence.SELF_CHECK_MIN_REFLECTION_RATE:.0%}: *{emergence.PHASES[1]}*; else backtracking < "
        f"{emergence.BACKTRACK_MIN_RATE:.0%}: *{emergence.PHASES[2]}*; else *{emergence.PHASES[3]}*.",
        aha_rule_text(measured["rules"]) + " [reflection.png](reflection.png) plots reflection rate and accuracy "
        "against GRPO step with the marked step.\n" + "\n".join(aha),
    ])


def aha_rule_text(rules: dict[str, Any]) -> str:
    """``find_aha_step``'s rule in the report's words, with its constants."""
    base, window, persist = rules["aha_baseline"], rules["aha_window"], rules["aha_persist"]
    return (
        f"Aha rule: `find_aha_step` over each RL stage's logged `completions/checking_rate` (a missed try followed "
        f"by a check and another try: a task with tries) where logged, else its `{REFLECTION_KEY}` (the training "
        f"samples of each step), and per source of a mixture its own (`completions/{{source}}/checking_rate`, else "
        f"`completions/{{source}}/reflection_rate`). Each step's rate "
        f"is a share of its logged `completions/count` (`completions/{{source}}/count`; {rules['aha_default_count']:g} "
        f"where not logged). p0 = the pooled rate of the first {base} steps (N0 completions); a span of steps (N "
        f"completions, pooled rate r) is above the start when r - p0 > max({rules['aha_z']:g} se, "
        f"{rules['aha_min_rise']:g}), se = sqrt(q(1-q)(1/N0 + 1/N)), q the pooled rate of both. The last {base} "
        f"steps must be above the start (a dip that recovers, a spike, flat noise: no aha); the first {window}-step "
        f"window after the start that is above it, with the next {persist} windows above it too, detects; the step "
        f"marked is the first step of that window whose own rate is above p0 by that window's threshold. Beside it: "
        f"the accuracy change, the mean per-step accuracy from the marked step to the end of the last of those "
        f"windows minus its mean over the first {base} steps.")


def aha_line(label: str, step: int | None, detail: dict[str, Any], rules: dict[str, Any]) -> str:
    """One RL stage's (or source's) aha verdict: the step, the curve read, the start level and the accuracy change."""
    read = f" (read `{detail['curve']}`)" if detail.get("curve") else ""
    if step is None:
        return f"- {label}: no aha step found under the rule{read}"
    line = f"- {label}: candidate aha step **{step}**{read}"
    if detail.get("p0") is not None and detail.get("rise"):
        first, last = detail["rise"]
        line += (f": {100 * detail['p0']:.1f}% over the first {rules['aha_baseline']} steps, above it over steps "
                 f"{first}-{last}")
        if detail.get("accuracy_change") is not None:
            line += (f"; accuracy (`{detail['accuracy']}`) {100 * detail['accuracy_change']:+.1f} points over "
                     f"those steps vs the first {rules['aha_baseline']}")
    return line
