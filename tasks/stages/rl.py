"""The RL stages' one body: GRPO on prepare_data's training prompts, starting from the model of the stage its table
entry's ``init_from`` names, with the rewards its section names. grpo_train (from cold_start_sft, verifiable
rewards) and final_rl (from sft_consolidate, the broader mix: accuracy, format, language consistency, overlong
penalty, a reward model) are two entries of it; a new RL stage is one more entry (``tasks/config/stages.py``).

The trainer (grpo_core.trainer.loop.train_grpo) reports each step to a Prefect progress artifact and each
checkpoint to the store; a crashed attempt is retried and resumes from the store's newest checkpoint.
Output: ``model/`` and ``metrics.jsonl`` (reward, accuracy, completion length per step: the report's plots).
"""

from __future__ import annotations

from typing import Any

from tasks.runner.common import StageContext, StageFailed, stage_task
from tasks.runner.training import heldout_inputs, train_and_commit
from tasks.storage.manifest import StageRef


@stage_task
def rl(ctx: StageContext, parents: dict[str, StageRef], fp: str) -> StageRef:
    data = parents["prepare_data"]
    check_source_rows(ctx, ctx.section, data)
    return train_and_commit(ctx, model_path=ctx.init_model(parents), rows_path=ctx.fetch(data, "train.parquet"),
                            parents=parents, fp=fp, **heldout_inputs(ctx, data))


def check_source_rows(ctx: StageContext, section: Any, data: StageRef) -> None:
    """Fail an RL stage before it loads anything when one of its ``sources`` has no training rows in ``data``
    (prepare_data's output), naming what prepare_data did with that source's rows."""
    missing = [s.name for s in getattr(section, "sources", []) if not data.metrics.get(f"data/{s.name}/num_train")]
    if not missing:
        return
    stats = ctx.store.manifest(data).get("data_stats", {})
    present = ", ".join(sorted(stats.get("train_by_source", {}))) or "none"
    causes = []
    for name in missing:
        dropped = stats.get("train_contaminated_by_source", {}).get(name)
        causes.append(
            f"source {name!r}: prepare_data's decontamination dropped all {dropped['of']} of its rows (they share "
            f"{stats.get('ngram_size', 'n')}-word runs with eval prompts, e.g. {dropped['example_ngram']!r}); see "
            "data.ngram_size / data.decontaminate and rerun prepare_data" if dropped else
            f"source {name!r}: prepare_data wrote no rows with this source (the train sources are: {present}); fix "
            f"{ctx.stage}.sources[].name or the data source's `source:`")
    raise StageFailed(f"{ctx.stage}: " + "; ".join(causes) + f" ({data.uri})")
