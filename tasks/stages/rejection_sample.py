"""Stage 4, rejection_sample: sample N completions per training prompt from the GRPO model and keep the
correct ones that pass the format, length and language filters, deduplicated, at most k per prompt
(grpo_core.recipe.rejection; with ``sampling.tools`` the samples are multi-turn trajectories, kept when the final
answer is right, their tool turns kept in the text); with ``sources`` each source by its own rule (a reward model /
judge score for the non-verifiable ones; ``model: reward_model`` names the reward_model stage's output, then an input
here).
Output: ``samples.parquet`` (SFT rows ``{prompt, completion, ...}``) and ``pass_rates.parquet`` (one row per
prompt), with the keep/drop counts in the manifest.
"""

from __future__ import annotations

from typing import Any

from grpo_core.data.rows import read_parquet, write_parquet
from tasks.config.plan import check_stage_memory
from tasks.runner.common import StageContext, commit_stage, resolve_reward_models, stage_task
from tasks.storage.manifest import StageRef


@stage_task
def rejection_sample(ctx: StageContext, parents: dict[str, StageRef], fp: str) -> StageRef:
    rows = read_parquet(ctx.fetch(parents["prepare_data"], "train.parquet"))
    kept, stats = _sample(ctx, ctx.init_model(parents), rows, parents)  # the model of the stage it samples
    out = ctx.work / "out"
    write_parquet(kept, out / "samples.parquet")
    write_parquet(stats.pop("per_prompt"), out / "pass_rates.parquet")
    with ctx.begin() as writer:
        writer.put_dir(out)
        return commit_stage(ctx, writer, fp=fp, parents=parents, metrics=stats)


def _sample(ctx: StageContext, model_path: str, rows: list[dict[str, Any]], parents: dict[str, StageRef]
            ) -> tuple[list[dict[str, Any]], dict]:
    """Sample with this stage's own backend settings (its section's ``sampling``: vLLM for real runs, transformers
    for tiny ones)."""
    import torch
    from transformers import AutoConfig, AutoTokenizer

    # heavy import (torch): the flow process imports this module before any sampling
    from grpo_core.generation import backend_kind, backend_options, make_backend
    from grpo_core.recipe.rejection import rejection_sample

    rs = resolve_reward_models(ctx, ctx.section, parents)
    kind = backend_kind(rs.sampling.use_vllm)
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    tokenizer = AutoTokenizer.from_pretrained(model_path)
    check_stage_memory(ctx.stage, ctx.entry.kind, rs, model_path)  # CUDA only: fail fast when it cannot fit
    opts = backend_options(rs.sampling, kind, device, seed=rs.seed, bf16=rs.bf16,
                           model_config=AutoConfig.from_pretrained(model_path))
    backend = make_backend(kind, model_path, tokenizer=tokenizer, **opts)
    return rejection_sample(rs, backend, tokenizer, rows)
