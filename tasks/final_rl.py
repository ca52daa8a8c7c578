"""Stage 6, final_rl: GRPO again from the consolidated SFT model, with the broader reward mix the
``final_rl`` config section names (accuracy, format, language consistency, overlong penalty).
Output: ``model/`` and ``metrics.jsonl``.
"""

from __future__ import annotations

from typing import Any

from grpo_core.config import PipelineConfig
from tasks._common import StageContext, cached, fingerprint, stage_task
from tasks._training import train_and_commit
from tasks.store import StageRef

STAGE = "final_rl"


@stage_task(STAGE)
def final_rl(config: PipelineConfig | dict[str, Any], run: str, store: str | None = None,
             inputs: dict[str, StageRef] | None = None, force: bool = False) -> StageRef:
    ctx = StageContext.open(config, run, store, STAGE)
    try:
        data, sft = (inputs or {})["prepare_data"], (inputs or {})["sft_consolidate"]
        parents = {"prepare_data": data, "sft_consolidate": sft}
        fp = fingerprint(STAGE, ctx.config.final_rl, parents)
        if (ref := ctx.reuse(fp, force)) is not None:
            return cached(ref, "same config and inputs")
        return train_and_commit(ctx, kind="grpo", section=ctx.config.final_rl,
                                model_path=str(ctx.fetch(sft, "model")), rows_path=ctx.fetch(data, "train.parquet"),
                                parents=parents, fp=fp)
    finally:
        ctx.cleanup()
