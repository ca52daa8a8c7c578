"""Plot a GRPO stage's curves as its MLflow tracker recorded them: the training reward and mean completion length
every step, and the held-out accuracy and reflection rate of ``eval_steps`` on the same step axis.

    python infra/tracker_plot.py TRACKERS_DIR RUN STAGE OUT.png

``TRACKERS_DIR``: a stage's committed ``trackers/`` folder or ``run.tracking_dir`` (the MLflow file store is its
``mlflow/``); ``RUN`` is the MLflow experiment (the pipeline run), ``STAGE`` the tracker run's stage. Read through
MLflow's own client, so the figure shows what a user opening ``mlflow ui`` sees (the README's tracker figure).
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

CURVES = (("reward", "training reward"), ("completions/mean_length", "mean completion length (tokens)"),
          ("eval/accuracy", "held-out greedy accuracy"), ("eval/reflection_rate", "held-out reflection rate"))


def read_curves(trackers: Path, run: str, stage: str) -> dict[str, list[tuple[int, float]]]:
    """``{metric: [(step, value), ...]}`` of the stage's MLflow run in the file store under ``trackers``."""
    os.environ.setdefault("MLFLOW_ALLOW_FILE_STORE", "true")
    from mlflow.tracking import MlflowClient

    client = MlflowClient(tracking_uri=f"file:{(trackers / 'mlflow').resolve()}")
    experiment = client.get_experiment_by_name(run)
    if experiment is None:
        raise SystemExit(f"no MLflow experiment {run!r} under {trackers / 'mlflow'}")
    runs = [r for r in client.search_runs([experiment.experiment_id]) if stage in (r.info.run_name or "")]
    if not runs:
        raise SystemExit(f"no MLflow run of stage {stage!r} in experiment {run!r}")
    run_id = runs[0].info.run_id
    return {key: sorted((m.step, m.value) for m in client.get_metric_history(run_id, key)) for key, _ in CURVES}


def plot(curves: dict[str, list[tuple[int, float]]], title: str, out: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(11, 3.6))
    for ax, keys in zip(axes, (("reward", "eval/accuracy", "eval/reflection_rate"), ("completions/mean_length",))):
        for key in keys:
            points = curves.get(key) or []
            if points:
                steps, values = zip(*points)
                style = "o-" if key.startswith("eval/") else "-"
                ax.plot(steps, values, style, label=dict(CURVES)[key], markersize=4, linewidth=1)
        ax.set_xlabel("GRPO step")
        ax.legend(fontsize=8)
        ax.grid(alpha=0.3)
    fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    fig.savefig(out, dpi=110)


def main(argv: list[str]) -> None:
    if argv[:1] in (["-h"], ["--help"]):
        print(__doc__)
        return
    if len(argv) != 4:
        raise SystemExit(__doc__)
    trackers, run, stage, out = Path(argv[0]), argv[1], argv[2], Path(argv[3])
    curves = read_curves(trackers, run, stage)
    plot(curves, f"{stage} of run {run}, read back from its MLflow tracker", out)
    print(f"{out}: " + ", ".join(f"{k} {len(v)} points" for k, v in curves.items()))


if __name__ == "__main__":
    main(sys.argv[1:])
