"""Stage 1, prepare_data: normalised train/eval prompt sets, the cold-start SFT set, and (for the embedded
default) the tiny base model, written as parquet + a model folder and committed to the store.

Output files: ``train.parquet``, ``eval.parquet``, ``cold_start.parquet``, ``preferences.parquet`` (preference
pairs ``{prompt, chosen, rejected, source}`` of the built-in general sources; only when there are pairs),
``base_model/`` (tiny only; pretrained on the built-in task's worked solutions when ``model.tiny.pretrain``
is set). Every prompt row keeps its ``source`` column.
A bad row fails the stage before anything is written (grpo_core.data.DataError names file, row, field),
unless ``data.on_error: skip``, which counts the skipped rows in the manifest.
"""

from __future__ import annotations

from grpo_core.data import prepare_datasets, write_parquet
from tasks.common import StageContext, commit_stage, stage_task
from tasks.manifest import StageRef


@stage_task("prepare_data", section="data", key_model=True)
def prepare_data(ctx: StageContext, parents: dict[str, StageRef], fp: str) -> StageRef:
    cfg = ctx.config
    data = prepare_datasets(cfg.data)
    out = ctx.work / "out"
    write_parquet(data.train, out / "train.parquet")
    write_parquet(data.eval, out / "eval.parquet")
    write_parquet(data.cold_start, out / "cold_start.parquet")
    if data.preferences:  # the reward_model stage reads it, and says so when it is missing
        write_parquet(data.preferences, out / "preferences.parquet")
    pretrain: dict[str, float] = {}
    if cfg.model.tiny is not None:
        from grpo_core.tiny import build_tiny_model, pretrain_tiny_model

        build_tiny_model(out / "base_model", **cfg.model.tiny.architecture())
        if cfg.model.tiny.pretrain is not None:
            result = pretrain_tiny_model(out / "base_model", data.pretrain, cfg.model.tiny.pretrain, ctx.work / "pretrain")
            pretrain = {f"pretrain/{k.split('/')[-1]}": v for k, v in result.items()}
    with ctx.begin() as writer:
        writer.put_dir(out)
        metrics = {**pretrain, "data/num_train": len(data.train), "data/num_eval": len(data.eval),
                   "data/num_cold_start": len(data.cold_start), "data/num_preferences": len(data.preferences),
                   **{f"data/{source}/num_train": n for source, n in data.stats["train_by_source"].items()}}
        return commit_stage(ctx, writer, fp=fp, section=cfg.data, parents=parents, metrics=metrics,
                            extra={"data_stats": data.stats})
