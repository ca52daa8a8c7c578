"""Per-step metrics with TRL's names, written as JSON lines, TensorBoard scalars and to the experiment trackers.

``output_dir/metrics.jsonl`` holds one object per step (``{"step": N, ...}``). On resume it is
rewritten from the checkpoint's history, so a step run after the checkpoint and before a crash never
appears twice; TensorBoard events past the resumed step are purged (``purge_step``). W&B, MLflow and Trackio
(``report_to``) are ``trainer/trackers.py``. Completion tables (GRPO's ``log_completions_steps``) go to
``output_dir/completions.jsonl`` (one object per completion, with its ``step``; cut back to the resumed step
like ``metrics.jsonl``) under ``jsonl``, and to each tracker as the table ``completions``.

``tokens_per_second`` counts prompt + completion tokens of every generated sequence over the step's
wall time (generation, rewards and training together).

``completions/reflection_rate``, ``completions/mean_steps``, ``completions/backtrack_rate`` and
``completions/direct_rate`` are the seed's emergence features (``grpo_core.evaluation.emergence``) of the step's
generated completions, with the phrase lists of ``GRPOConfig.emergence``; the report's "aha" step is read
off ``completions/reflection_rate``. A step over several sources also logs ``completions/{source}/reflection_rate``,
``/mean_steps`` and ``/mean_length`` per source.

Multi-turn tool rollouts (``sampling.tools``): ``completions/mean_length`` and the other lengths count a trajectory's
tokens as its sequence holds them, tool turns included (what ``max_completion_length`` bounds and
``completions/clipped_ratio`` refers to); ``completions/mean_model_length`` counts the policy's own tokens, tool
turns left out (the length the loss trains on). ``tools/...`` (``tool_metrics``) are the step's tool use.

``completions/count`` is the step's generated completions and, given each completion's correctness (the trainer:
its source's first reward function passes, >= 1), ``completions/accuracy`` their share that is right; a step over
several sources logs both per source too (``completions/{source}/count``, ``/accuracy``). For completions of a task
with tries (the countdown: ``grpo_core.evaluation.checking``) the step logs whether reflection is checking that
pays: ``completions/checking_rate``, ``/miss_retry_rate``, ``/hit_stop_rate``, ``/first_try_hit_rate``,
``/retry_hit_rate``, ``/reflection_after_hit_rate``, ``/reflection_without_try_rate``; per source
(``completions/{source}/checking_rate``, ...) for each source with tries in a step over several sources, without
``{source}/`` in a step with one source.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import math
import os
from pathlib import Path
from typing import Any, Sequence

import torch

from grpo_core.config import BACKTRACK_PHRASES, REFLECTION_PHRASES, TrackingInfo
from grpo_core.evaluation.checking import CHECKING_KEYS, checking_stats, has_tries
from grpo_core.evaluation.emergence import emergence_metrics
from grpo_core.generation import Rollout
from grpo_core.generation.trajectory import TrajectoryStats
from grpo_core.trainer.trackers import Table, Trackers

logger = logging.getLogger(__name__)


def reward_metrics(rewards_per_func: torch.Tensor, names: list[str]) -> dict[str, float]:
    """``rewards/<name>/mean`` and ``/std`` over the completions where the function gave a score."""
    out = {}
    for col, name in enumerate(names):
        values = rewards_per_func[:, col]  # [B]
        values = values[~torch.isnan(values)]
        out[f"rewards/{name}/mean"] = values.mean().item() if values.numel() else math.nan
        out[f"rewards/{name}/std"] = values.std().item() if values.numel() > 1 else 0.0
    return out


def completion_metrics(rollouts: list[Rollout], reflection_phrases: Sequence[str] = REFLECTION_PHRASES,
                       backtrack_phrases: Sequence[str] = BACKTRACK_PHRASES, *, prompts: Sequence[Any] | None = None,
                       correct: Sequence[bool] | None = None) -> dict[str, float]:
    """The step's completion features (module docstring); ``prompts`` (one per rollout) add the checking numbers
    where they are of a task with tries, ``correct`` (one per rollout) ``completions/accuracy``."""
    lengths = [len(r.completion_ids) for r in rollouts]
    features = emergence_metrics([r.text for r in rollouts], reflection_phrases=reflection_phrases,
                                 backtrack_phrases=backtrack_phrases)
    out = {
        **{f"completions/{k}": features[k] for k in ("reflection_rate", "mean_steps", "backtrack_rate", "direct_rate")},
        "completions/mean_length": sum(lengths) / len(lengths),
        "completions/min_length": float(min(lengths)),
        "completions/max_length": float(max(lengths)),
        "completions/clipped_ratio": sum(r.truncated for r in rollouts) / len(rollouts),
        "completions/count": float(len(rollouts)),
    }
    if any(r.tool_mask is not None for r in rollouts):  # multi-turn: the lengths above count the tool turns too
        model = [len(r.completion_ids) - sum(r.tool_mask or []) for r in rollouts]
        out["completions/mean_model_length"] = sum(model) / len(model)
    if correct is not None:
        out["completions/accuracy"] = sum(map(bool, correct)) / len(correct) if correct else math.nan
    if prompts is not None and has_tries(prompts):
        checking = checking_stats([r.text for r in rollouts], prompts, reflection_phrases)
        out.update({f"completions/{k}": checking[k] for k in CHECKING_KEYS})
    return out


def tool_metrics(parts: Sequence[tuple[TrajectoryStats, dict[str, float]]]) -> dict[str, float]:
    """``tools/...`` of a step's multi-turn rollouts over every rank's ``(TrajectoryStats, ToolSet.stats())``:
    turns, calls and errors per trajectory, budget and turn-limit endings (``TrajectoryStats.metrics``), and the
    tool set's counts summed (calls, errors, timeouts, seconds per tool; malformed calls, unknown tools)."""
    merged = TrajectoryStats()
    counts: dict[str, float] = {}
    for stats, tool_counts in parts:
        for f in dataclasses.fields(TrajectoryStats):
            setattr(merged, f.name, getattr(merged, f.name) + getattr(stats, f.name))
        for key, value in tool_counts.items():
            counts[key] = counts.get(key, 0.0) + value
    return {**merged.metrics(), **counts}


def source_completion_metrics(rollouts: list[Rollout], labels: Sequence[str],
                              reflection_phrases: Sequence[str] = REFLECTION_PHRASES,
                              backtrack_phrases: Sequence[str] = BACKTRACK_PHRASES, *,
                              prompts: Sequence[Any] | None = None, correct: Sequence[bool] | None = None
                              ) -> dict[str, float]:
    """``completions/{source}/reflection_rate``, ``/mean_steps``, ``/mean_length`` and ``/count`` of each source's
    completions (``labels``: one per rollout) when the step holds more than one source: a source that never reflects
    (an arithmetic chain, a general prompt) would otherwise dilute another's rise. With ``correct`` also
    ``/accuracy``; with ``prompts`` the checking numbers of each source with tries (``completion_metrics``)."""
    if len(set(labels)) < 2:
        return {}
    out = {}
    for name in sorted(set(labels)):
        idx = [i for i, label in enumerate(labels) if label == name]
        mine = completion_metrics([rollouts[i] for i in idx], reflection_phrases, backtrack_phrases,
                                  prompts=None if prompts is None else [prompts[i] for i in idx],
                                  correct=None if correct is None else [correct[i] for i in idx])
        out.update({f"completions/{name}/{key.removeprefix('completions/')}": value for key, value in mine.items()
                    if key.removeprefix("completions/") in ("reflection_rate", "mean_steps", "mean_length", "count",
                                                            "accuracy", *CHECKING_KEYS)})
    return out


class MetricsWriter:
    """Append-only per-step metrics; construct with the resumed history to drop anything after it."""

    def __init__(self, output_dir: Path, report_to: list[str], history: list[dict[str, Any]], resumed_step: int,
                 *, config: dict[str, Any] | None = None, tracking: TrackingInfo | None = None) -> None:
        self.path = output_dir / "metrics.jsonl"
        self.completions = output_dir / "completions.jsonl"
        self.jsonl = "jsonl" in report_to
        history = [row for row in history if row["step"] <= resumed_step]
        if self.jsonl:
            rewrite_jsonl(self.path, history)
            if self.completions.exists():
                kept = [json.loads(line) for line in self.completions.read_text().splitlines() if line.endswith("}")]
                rewrite_jsonl(self.completions, [r for r in kept if r["step"] <= resumed_step])
        self.tb = None
        if "tensorboard" in report_to:
            try:
                from torch.utils.tensorboard import SummaryWriter
            except ImportError:  # tensorboard is optional: JSON lines still work
                logger.warning("tensorboard is not installed; writing metrics.jsonl only")
            else:
                self.tb = SummaryWriter(str(output_dir / "runs"), purge_step=resumed_step + 1 if resumed_step else None)
        self.trackers = Trackers(report_to, tracking or TrackingInfo(), output_dir, config or {}, history)

    def write(self, step: int, metrics: dict[str, Any]) -> None:
        if self.jsonl:
            append_jsonl(self.path, [{"step": step, **metrics}])
        if self.tb is not None:
            for key, value in metrics.items():
                if isinstance(value, (int, float)) and math.isfinite(value):
                    self.tb.add_scalar(key, value, step)
            self.tb.flush()
        self.trackers.log(step, metrics)

    def write_table(self, step: int, table: Table) -> None:
        """A completion table at ``step``: ``completions.jsonl`` (under jsonl) and every tracker."""
        if self.jsonl:
            append_jsonl(self.completions, [{"step": step, **dict(zip(table.columns, row))} for row in table.rows])
        self.trackers.log_table(step, "completions", table)

    def close(self) -> None:
        if self.tb is not None:
            self.tb.close()
        self.trackers.close()


def rewrite_jsonl(path: Path, rows: list[dict[str, Any]]) -> None:
    """``path`` holding exactly ``rows``, replaced atomically."""
    tmp = path.with_suffix(".jsonl.tmp")
    with open(tmp, "w") as f:
        for row in rows:
            f.write(json.dumps(row) + "\n")
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


def append_jsonl(path: Path, rows: list[dict[str, Any]]) -> None:
    with open(path, "a") as f:
        for row in rows:
            f.write(json.dumps(row) + "\n")
        f.flush()
        os.fsync(f.fileno())


def completion_table(rollouts: list[Rollout], rows: list[dict[str, Any]], rewards_per_func: torch.Tensor,
                     reward_names: list[str], rewards: torch.Tensor, num_generations: int, tokenizer: Any
                     ) -> Table:
    """One row per completion: prompt (decoded), completion, each reward function's score (None where it gave
    none), the combined reward and the row's source; ``rows`` holds one dataset row per group."""
    columns = ["prompt", "completion", *[f"reward/{n}" for n in reward_names], "reward", "source"]
    out = []
    for i, r in enumerate(rollouts):
        row = rows[i // num_generations]
        scores = [None if math.isnan(v) else float(v) for v in rewards_per_func[i].tolist()]
        out.append([tokenizer.decode(r.prompt_ids, skip_special_tokens=True), r.text, *scores,
                    float(rewards[i]), str(row.get("source", ""))])
    return Table(columns, out)
