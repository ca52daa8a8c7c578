"""Stage 3, grpo_train: GRPO on verifiable rewards, starting from the cold-start SFT model.

The trainer (grpo_core.trainer.loop.train_grpo) reports each step to a Prefect progress artifact and each
checkpoint to the store; a crashed attempt is retried and resumes from the store's newest checkpoint.
Output: ``model/`` and ``metrics.jsonl`` (reward, accuracy, completion length per step: the report's plots).
"""

from __future__ import annotations

from tasks.runner.common import StageContext, stage_task
from tasks.runner.training import heldout_inputs, train_and_commit
from tasks.stages.prepare_data import check_source_rows
from tasks.storage.manifest import StageRef


@stage_task("grpo_train")
def grpo_train(ctx: StageContext, parents: dict[str, StageRef], fp: str) -> StageRef:
    check_source_rows(ctx, ctx.config.grpo_train, parents["prepare_data"])
    return train_and_commit(ctx, kind="grpo", section=ctx.config.grpo_train,
                            model_path=str(ctx.fetch(parents["cold_start_sft"], "model")),
                            rows_path=ctx.fetch(parents["prepare_data"], "train.parquet"), parents=parents, fp=fp,
                            **heldout_inputs(ctx, ctx.config.grpo_train, parents["prepare_data"]))
