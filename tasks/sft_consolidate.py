"""Stage 5, sft_consolidate: SFT on the rejection-sampled set, optionally mixed with cold-start rows.

Starts from ``sft_consolidate.init_from``: the base model (as R1 does), the cold-start model, or the GRPO
model (what notes/embedded-default.md found to work at the tiny scale). Only the parent it actually starts
from enters the fingerprint. Output: ``model/`` and ``metrics.jsonl``.
"""

from __future__ import annotations

import random
from typing import Any

from grpo_core.config import PipelineConfig
from grpo_core.data import read_parquet, write_parquet
from tasks._common import StageContext, StageFailed, cached, fingerprint, stage_task
from tasks._training import train_and_commit
from tasks.store import StageRef

STAGE = "sft_consolidate"


def upstream(config: PipelineConfig) -> list[str]:
    init = config.sft_consolidate.init_from
    return ["prepare_data", "rejection_sample"] + ([] if init == "base" else [init])


@stage_task(STAGE)
def sft_consolidate(config: PipelineConfig | dict[str, Any], run: str, store: str | None = None,
                    inputs: dict[str, StageRef] | None = None, force: bool = False) -> StageRef:
    ctx = StageContext.open(config, run, store, STAGE)
    try:
        section = ctx.config.sft_consolidate
        parents = {name: (inputs or {})[name] for name in upstream(ctx.config)}
        fp = fingerprint(STAGE, section, parents)
        if (ref := ctx.reuse(fp, force)) is not None:
            return cached(ref, "same config and inputs")
        data = parents["prepare_data"]
        rows = read_parquet(ctx.fetch(parents["rejection_sample"], "samples.parquet"))
        if not rows:
            raise StageFailed("rejection_sample kept no samples, so there is nothing to fine-tune on; sample more "
                              "(rejection_sample.num_samples / max_prompts) or relax its filters")
        n_mix = 0
        if section.cold_start_mix > 0:
            cold = read_parquet(ctx.fetch(data, "cold_start.parquet"))
            n_mix = min(len(cold), round(len(rows) * section.cold_start_mix / (1 - section.cold_start_mix + 1e-9)))
            rows += random.Random(section.seed).sample(cold, n_mix)
        rows_path = write_parquet([{"prompt": r["prompt"], "completion": r["completion"]} for r in rows],
                                  ctx.work / "sft_rows.parquet")
        init = section.init_from
        model_path = ctx.base_model(data) if init == "base" else str(ctx.fetch(parents[init], "model"))
        return train_and_commit(ctx, kind="sft", section=section, model_path=model_path, rows_path=rows_path,
                                parents=parents, fp=fp,
                                extra_metrics={"data/num_sft_rows": len(rows), "data/num_mixed_cold_start": n_mix})
    finally:
        ctx.cleanup()
