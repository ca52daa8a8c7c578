"""Stage 2, cold_start_sft: SFT of the base model on the cold-start chain-of-thought set.

Loss on completion tokens only, chat template applied (grpo_core.trainer.sft.train_sft). Output: ``model/``
and ``metrics.jsonl`` (one line per logged step).
"""

from __future__ import annotations

from tasks.runner.common import StageContext, stage_task
from tasks.runner.training import train_and_commit
from tasks.storage.manifest import StageRef


@stage_task
def cold_start_sft(ctx: StageContext, parents: dict[str, StageRef], fp: str) -> StageRef:
    data = parents["prepare_data"]
    return train_and_commit(ctx, model_path=ctx.base_model(data), rows_path=ctx.fetch(data, "cold_start.parquet"),
                            parents=parents, fp=fp)
