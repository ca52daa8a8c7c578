"""Stage 5, sft_consolidate: SFT on the rejection-sampled set, optionally mixed with cold-start rows and, as R1
did, with general SFT data at ``reasoning_to_general`` reasoning rows per general row (grpo_core.recipe.consolidation).
Rejection-sampled answers to general prompts and cold-start rows of general sources (sources whose prompts in
prepare_data's ``train.parquet`` have no reference answer) count as general, so with ``general_sources`` the
ratio is reasoning rows to all general rows; every row's ``source`` is ``reasoning`` or ``general:{name}``.

Starts from ``sft_consolidate.init_from``: the base model (as R1 does), the cold-start model, the GRPO
model (what worked best at the embedded default's scale), or ``model``: ``init_model``, any model folder or hub
name (a smaller base distils the same data). Only the parent it actually starts from is an input (the stage
table's ``upstream``), so only that one enters the fingerprint. Output: ``model/``, ``metrics.jsonl`` and
``sft_rows.parquet`` (the rows trained on, each with its ``source``).
"""

from __future__ import annotations

import random

from grpo_core.data.rows import read_parquet, write_parquet
from grpo_core.recipe.consolidation import (REASONING, count_by_source, general_source_names, label_rows, load_general_rows,
                                     mix_by_ratio)
from tasks.runner.common import StageContext, StageFailed, stage_task
from tasks.runner.training import train_and_commit
from tasks.storage.manifest import StageRef


@stage_task
def sft_consolidate(ctx: StageContext, parents: dict[str, StageRef], fp: str) -> StageRef:
    section = ctx.section
    data = parents["prepare_data"]
    rows = read_parquet(ctx.fetch(parents["rejection_sample"], "samples.parquet"))
    if not rows:
        raise StageFailed("rejection_sample kept no samples, so there is nothing to fine-tune on; sample more "
                          "(rejection_sample.sampling.num_generations / max_prompts) or relax its filters")
    n_mix = 0
    if section.cold_start_mix > 0:
        cold = read_parquet(ctx.fetch(data, "cold_start.parquet"))
        if section.cold_start_sources:  # e.g. only the general sources' rows: R1 mixes non-reasoning data in here
            cold = [r for r in cold if r.get("source") in section.cold_start_sources]
            if not cold:
                raise StageFailed(f"{ctx.stage}.cold_start_sources {section.cold_start_sources} match no "
                                  "cold-start rows; name sources of cold_start.parquet's source column")
        n_mix = min(len(cold), round(len(rows) * section.cold_start_mix / (1 - section.cold_start_mix + 1e-9)))
        rows += random.Random(section.seed).sample(cold, n_mix)
    # rejection-sampled answers to general prompts and general cold-start rows are general data, not reasoning
    general_names = general_source_names(read_parquet(ctx.fetch(data, "train.parquet")))
    if section.general_sources:  # R1's non-reasoning data: reasoning rows : every general row = reasoning_to_general
        general = {src.path: load_general_rows(src, on_error=ctx.config.data.on_error) for src in section.general_sources}
        rows, counts = mix_by_ratio(rows, general, section.reasoning_to_general, seed=section.seed,
                                    general_row_sources=general_names)
        if not counts.get(REASONING):
            raise StageFailed("the consolidation set has no reasoning rows (rejection_sample kept only general "
                              f"sources' answers), so {ctx.stage}.reasoning_to_general leaves no general rows "
                              "either; sample more reasoning prompts (rejection_sample.sources / max_prompts) or "
                              "relax their filters")
    else:  # the set as it is, labelled reasoning / general:{source}
        rows = label_rows(rows, general_names)
        counts = count_by_source(rows)
    rows_path = write_parquet(rows, ctx.work / "sft_rows.parquet")
    init = section.init_from
    model_path = (ctx.base_model(data) if init == "base" else section.init_model if init == "model"
                  else str(ctx.fetch(parents[init], "model")))
    return train_and_commit(ctx, model_path=str(model_path), rows_path=rows_path, parents=parents, fp=fp,
                            extra_files={"sft_rows.parquet": rows_path},
                            extra_metrics={"data/num_sft_rows": len(rows), "data/num_mixed_cold_start": n_mix,
                                           **{f"data/num_rows/{k}": v for k, v in counts.items()}})
