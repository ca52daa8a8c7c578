"""Stage 2, cold_start_sft: SFT of the base model on the cold-start chain-of-thought set.

Loss on completion tokens only, chat template applied (grpo_core.sft.train_sft). Output: ``model/``
and ``metrics.jsonl`` (one line per logged step).
"""

from __future__ import annotations

from typing import Any

from grpo_core.config import PipelineConfig
from tasks._common import StageContext, cached, fingerprint, stage_task
from tasks._training import train_and_commit
from tasks.store import StageRef

STAGE = "cold_start_sft"


@stage_task(STAGE)
def cold_start_sft(config: PipelineConfig | dict[str, Any], run: str, store: str | None = None,
                   inputs: dict[str, StageRef] | None = None, force: bool = False) -> StageRef:
    ctx = StageContext.open(config, run, store, STAGE)
    try:
        data = (inputs or {})["prepare_data"]
        parents = {"prepare_data": data}
        fp = fingerprint(STAGE, ctx.config.cold_start_sft, parents)
        if (ref := ctx.reuse(fp, force)) is not None:
            return cached(ref, "same config and inputs")
        return train_and_commit(ctx, kind="sft", section=ctx.config.cold_start_sft,
                                model_path=ctx.base_model(data), rows_path=ctx.fetch(data, "cold_start.parquet"),
                                parents=parents, fp=fp)
    finally:
        ctx.cleanup()
