"""Stage 3, grpo_train: GRPO on verifiable rewards, starting from the cold-start SFT model.

The trainer (grpo_core.trainer.train_grpo) reports each step to a Prefect progress artifact and each
checkpoint to the store; a crashed attempt is retried and resumes from the store's newest checkpoint.
Output: ``model/`` and ``metrics.jsonl`` (reward, accuracy, completion length per step: the report's plots).
"""

from __future__ import annotations

from typing import Any

from grpo_core.config import PipelineConfig
from tasks._common import StageContext, cached, fingerprint, stage_task
from tasks._training import train_and_commit
from tasks.store import StageRef

STAGE = "grpo_train"


@stage_task(STAGE)
def grpo_train(config: PipelineConfig | dict[str, Any], run: str, store: str | None = None,
               inputs: dict[str, StageRef] | None = None, force: bool = False) -> StageRef:
    ctx = StageContext.open(config, run, store, STAGE)
    try:
        data, sft = (inputs or {})["prepare_data"], (inputs or {})["cold_start_sft"]
        parents = {"prepare_data": data, "cold_start_sft": sft}
        fp = fingerprint(STAGE, ctx.config.grpo_train, parents)
        if (ref := ctx.reuse(fp, force)) is not None:
            return cached(ref, "same config and inputs")
        return train_and_commit(ctx, kind="grpo", section=ctx.config.grpo_train,
                                model_path=str(ctx.fetch(sft, "model")), rows_path=ctx.fetch(data, "train.parquet"),
                                parents=parents, fp=fp)
    finally:
        ctx.cleanup()
