"""Stage 5, sft_consolidate: SFT on the rejection-sampled set, optionally mixed with cold-start rows.

Starts from ``sft_consolidate.init_from``: the base model (as R1 does), the cold-start model, or the GRPO
model (what worked best at the embedded default's scale). Only the parent it actually starts from is an
input (``upstream``), so only that one enters the fingerprint. Output: ``model/`` and ``metrics.jsonl``.
"""

from __future__ import annotations

import random

from grpo_core.data import read_parquet, write_parquet
from tasks.common import StageContext, StageFailed, stage_task
from tasks.config import PipelineConfig
from tasks.manifest import StageRef
from tasks.training import train_and_commit


def upstream(config: PipelineConfig) -> tuple[str, ...]:
    init = config.sft_consolidate.init_from
    return ("prepare_data", "rejection_sample") + (() if init == "base" else (init,))


@stage_task("sft_consolidate")
def sft_consolidate(ctx: StageContext, parents: dict[str, StageRef], fp: str) -> StageRef:
    section = ctx.config.sft_consolidate
    data = parents["prepare_data"]
    rows = read_parquet(ctx.fetch(parents["rejection_sample"], "samples.parquet"))
    if not rows:
        raise StageFailed("rejection_sample kept no samples, so there is nothing to fine-tune on; sample more "
                          "(rejection_sample.num_samples / max_prompts) or relax its filters")
    n_mix = 0
    if section.cold_start_mix > 0:
        cold = read_parquet(ctx.fetch(data, "cold_start.parquet"))
        if section.cold_start_sources:  # e.g. only the general sources' rows: R1 mixes non-reasoning data in here
            cold = [r for r in cold if r.get("source") in section.cold_start_sources]
            if not cold:
                raise StageFailed(f"sft_consolidate.cold_start_sources {section.cold_start_sources} match no "
                                  "cold-start rows; name sources of cold_start.parquet's source column")
        n_mix = min(len(cold), round(len(rows) * section.cold_start_mix / (1 - section.cold_start_mix + 1e-9)))
        rows += random.Random(section.seed).sample(cold, n_mix)
    rows_path = write_parquet([{"prompt": r["prompt"], "completion": r["completion"],
                               "source": r.get("source") or "rejection_sample"} for r in rows],
                              ctx.work / "sft_rows.parquet")
    init = section.init_from
    model_path = ctx.base_model(data) if init == "base" else str(ctx.fetch(parents[init], "model"))
    return train_and_commit(ctx, kind="sft", section=section, model_path=model_path, rows_path=rows_path,
                            parents=parents, fp=fp,
                            extra_metrics={"data/num_sft_rows": len(rows), "data/num_mixed_cold_start": n_mix})
