"""Stage 1, prepare_data: normalised train/eval prompt sets, the cold-start SFT set, and (for the embedded
default) the tiny base model, written as parquet + a model folder and committed to the store.

Output files: ``train.parquet``, ``eval.parquet``, ``cold_start.parquet``, ``base_model/`` (tiny only).
A bad row fails the stage before anything is written (grpo_core.data.DataError names file, row, field),
unless ``data.on_error: skip``, which counts the skipped rows in the manifest.
"""

from __future__ import annotations

from typing import Any

from grpo_core.config import PipelineConfig
from grpo_core.data import prepare_datasets, write_parquet
from tasks._common import StageContext, cached, commit_stage, fingerprint, stage_task
from tasks.store import StageRef

STAGE = "prepare_data"


@stage_task(STAGE)
def prepare_data(config: PipelineConfig | dict[str, Any], run: str, store: str | None = None,
                 inputs: dict[str, StageRef] | None = None, force: bool = False) -> StageRef:
    ctx = StageContext.open(config, run, store, STAGE)
    try:
        cfg = ctx.config
        fp = fingerprint(STAGE, cfg.data, {}, extra={"model": cfg.model.model_dump(mode="json")})
        if (ref := ctx.reuse(fp, force)) is not None:
            return cached(ref, "same data and model config")
        data = prepare_datasets(cfg.data)
        out = ctx.work / "out"
        write_parquet(data.train, out / "train.parquet")
        write_parquet(data.eval, out / "eval.parquet")
        write_parquet(data.cold_start, out / "cold_start.parquet")
        if cfg.model.tiny is not None:
            from grpo_core.tiny import build_tiny_model

            build_tiny_model(out / "base_model", **cfg.model.tiny.model_dump())
        with ctx.begin() as writer:
            writer.put_dir(out)
            metrics = {"data/num_train": len(data.train), "data/num_eval": len(data.eval),
                       "data/num_cold_start": len(data.cold_start)}
            return commit_stage(ctx, writer, fp=fp, section=cfg.data, parents={}, metrics=metrics,
                                extra={"data_stats": data.stats})
    finally:
        ctx.cleanup()
