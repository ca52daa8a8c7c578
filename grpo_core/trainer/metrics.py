"""Per-step metrics with TRL's names, written as JSON lines and TensorBoard scalars.

``output_dir/metrics.jsonl`` holds one object per step (``{"step": N, ...}``). On resume it is
rewritten from the checkpoint's history, so a step run after the checkpoint and before a crash never
appears twice; TensorBoard events past the resumed step are purged (``purge_step``).

``tokens_per_second`` counts prompt + completion tokens of every generated sequence over the step's
wall time (generation, rewards and training together).

``completions/reflection_rate``, ``completions/mean_steps``, ``completions/backtrack_rate`` and
``completions/direct_rate`` are the seed's emergence features (``grpo_core.evaluation.emergence``) of the step's
generated completions, with the phrase lists of ``GRPOConfig.emergence``; the report's "aha" step is read
off ``completions/reflection_rate``.
"""

from __future__ import annotations

import json
import logging
import math
import os
from pathlib import Path
from typing import Any, Sequence

import torch

from grpo_core.evaluation.emergence import BACKTRACK_PHRASES, REFLECTION_PHRASES, emergence_metrics
from grpo_core.generation import Rollout

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
                       backtrack_phrases: Sequence[str] = BACKTRACK_PHRASES) -> dict[str, float]:
    lengths = [len(r.completion_ids) for r in rollouts]
    features = emergence_metrics([r.text for r in rollouts], reflection_phrases=reflection_phrases,
                                 backtrack_phrases=backtrack_phrases)
    return {
        **{f"completions/{k}": features[k] for k in ("reflection_rate", "mean_steps", "backtrack_rate", "direct_rate")},
        "completions/mean_length": sum(lengths) / len(lengths),
        "completions/min_length": float(min(lengths)),
        "completions/max_length": float(max(lengths)),
        "completions/clipped_ratio": sum(r.truncated for r in rollouts) / len(rollouts),
    }


class MetricsWriter:
    """Append-only per-step metrics; construct with the resumed history to drop anything after it."""

    def __init__(self, output_dir: Path, report_to: list[str], history: list[dict[str, Any]], resumed_step: int) -> None:
        self.path = output_dir / "metrics.jsonl"
        self.jsonl = "jsonl" in report_to
        if self.jsonl:
            tmp = self.path.with_suffix(".jsonl.tmp")
            with open(tmp, "w") as f:
                for row in history:
                    if row["step"] <= resumed_step:
                        f.write(json.dumps(row) + "\n")
                f.flush()
                os.fsync(f.fileno())
            os.replace(tmp, self.path)
        self.tb = None
        if "tensorboard" in report_to:
            try:
                from torch.utils.tensorboard import SummaryWriter
            except ImportError:  # tensorboard is optional: JSON lines still work
                logger.warning("tensorboard is not installed; writing metrics.jsonl only")
            else:
                self.tb = SummaryWriter(str(output_dir / "runs"), purge_step=resumed_step + 1 if resumed_step else None)

    def write(self, step: int, metrics: dict[str, Any]) -> None:
        if self.jsonl:
            with open(self.path, "a") as f:
                f.write(json.dumps({"step": step, **metrics}) + "\n")
                f.flush()
                os.fsync(f.fileno())
        if self.tb is not None:
            for key, value in metrics.items():
                if isinstance(value, (int, float)) and math.isfinite(value):
                    self.tb.add_scalar(key, value, step)
            self.tb.flush()

    def close(self) -> None:
        if self.tb is not None:
            self.tb.close()
