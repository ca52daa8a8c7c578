"""The embedded default's base, pretrained before the recipe starts (as a real base model is): SFT of the tiny model
``grpo_core.models.tiny`` builds on worked solutions, tries and echoes (the rows ``recipe/prepare.py`` makes).
"""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

from grpo_core.trainer.sft import train_sft


def pretrain_tiny_model(model_dir: str | Path, rows: list[dict[str, Any]], config: Any, work_dir: str | Path
                        ) -> dict[str, Any]:
    """Train the model in ``model_dir`` on ``rows`` ``{prompt, completion}`` with ``config`` (an ``SFTConfig``)
    and put the result back in ``model_dir``; returns the SFT metrics (``train/loss``, ``train/steps``,
    ``train/runtime_s``). ``work_dir`` holds the checkpoints meanwhile (removed after)."""
    model_dir, work_dir = Path(model_dir), Path(work_dir)
    result = train_sft(config, model_dir, rows, work_dir, resume=False)
    shutil.rmtree(model_dir)
    shutil.copytree(result.pop("final_path"), model_dir)
    shutil.rmtree(work_dir)
    return result
