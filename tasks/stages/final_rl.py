"""Stage 6, final_rl: GRPO again from the consolidated SFT model, with the broader reward mix the
``final_rl`` config section names (accuracy, format, language consistency, overlong penalty).
Output: ``model/`` and ``metrics.jsonl``.
"""

from __future__ import annotations

from tasks.runner.common import StageContext, stage_task
from tasks.runner.training import heldout_inputs, train_and_commit
from tasks.stages.prepare_data import check_source_rows
from tasks.storage.manifest import StageRef


@stage_task("final_rl")
def final_rl(ctx: StageContext, parents: dict[str, StageRef], fp: str) -> StageRef:
    check_source_rows(ctx, ctx.config.final_rl, parents["prepare_data"])
    return train_and_commit(ctx, kind="grpo", section=ctx.config.final_rl,
                            model_path=str(ctx.fetch(parents["sft_consolidate"], "model")),
                            rows_path=ctx.fetch(parents["prepare_data"], "train.parquet"), parents=parents, fp=fp,
                            **heldout_inputs(ctx, ctx.config.final_rl, parents["prepare_data"]))
