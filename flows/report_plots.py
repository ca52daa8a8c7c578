"""The report's plots (PNG, matplotlib Agg): reward, accuracy and completion length over GRPO steps, and
reflection rate with each RL stage's candidate aha step. RL stages follow one another on a shared step
axis (final_rl continues after grpo_train). A stage run with ``eval_steps`` adds its held-out evaluations
(``eval/accuracy``, ``eval/reflection_rate``) as points on the same axis, to the accuracy and reflection plots."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from flows.report_emergence import REFLECTION_KEY, logged_sources
from flows.report_tables import ACCURACY_KEYS, LENGTH_KEYS, first_metric

HELDOUT_ACCURACY = ("eval/accuracy",)
HELDOUT_REFLECTION = ("eval/reflection_rate",)


def series(hist: list[dict[str, Any]], keys: tuple[str, ...], offset: int) -> list[tuple[int, float]]:
    """``(offset + step, value)`` of the rows that hold one of ``keys`` (rows without it are skipped)."""
    points = [(offset + h["step"], first_metric(h, keys)) for h in hist]
    return [(x, y) for x, y in points if y is not None]


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
        for i, (stage, hist) in enumerate(histories.items()):
            points = series(hist, keys, offset)
            if points:
                ax.plot(*zip(*points), color=f"C{i}", marker="." if len(points) < 40 else None, label=stage)
            if name == "accuracy" and (held := series(hist, HELDOUT_ACCURACY, offset)):  # eval_steps
                ax.plot(*zip(*held), "o--", color=f"C{i}", label=f"{stage} held-out greedy accuracy")
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


def plot_reflection(histories: dict[str, list[dict[str, Any]]], aha: dict[str, int | None], out_dir: Path) -> Path:
    """reflection.png: reflection rate and accuracy reward per GRPO step (RL stages one after the other, as
    ``plot_histories``), each source's reflection rate in a mixture, a dashed line at each candidate aha step."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    out_dir.mkdir(parents=True, exist_ok=True)
    fig, ax = plt.subplots(figsize=(6, 3.5), dpi=100)
    offset = 0
    for i, (stage, hist) in enumerate(histories.items()):
        for keys, style, label in (((REFLECTION_KEY,), "-", "reflection rate"), (ACCURACY_KEYS, ":", "accuracy reward"),
                                   (HELDOUT_REFLECTION, "s--", "held-out reflection rate"),
                                   (HELDOUT_ACCURACY, "o--", "held-out greedy accuracy")):
            points = series(hist, keys, offset)
            if points:
                marker = None if "held-out" in label else "." if len(points) < 40 else None
                ax.plot(*zip(*points), style, color=f"C{i}", marker=marker, label=f"{stage} {label}")
        for j, src in enumerate(logged_sources(hist)):
            points = series(hist, (f"completions/{src}/reflection_rate",), offset)  # a mixture: each source's own
            ax.plot(*zip(*points), "-", color=f"C{i}", alpha=0.5, linewidth=0.8 + j, label=f"{stage} {src} reflection")
        for label in [k for k in aha if k == stage or k.startswith(f"{stage} · ")]:
            if aha[label] is not None:
                ax.axvline(offset + aha[label], color=f"C{i}", linestyle="--", label=f"{label} aha? step {aha[label]}")
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
