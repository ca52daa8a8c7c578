"""Stage 4, rejection_sample: sample N completions per training prompt from the GRPO model and keep the
correct ones that pass the format, length and language filters, deduplicated, at most k per prompt
(grpo_core.rejection). Output: ``samples.parquet`` (SFT rows ``{prompt, completion, ...}``) and
``pass_rates.parquet`` (one row per prompt), with the keep/drop counts in the manifest.
"""

from __future__ import annotations

from typing import Any

from grpo_core.config import PipelineConfig
from grpo_core.data import read_parquet, write_parquet
from tasks._common import StageContext, cached, commit_stage, fingerprint, stage_task
from tasks.store import StageRef

STAGE = "rejection_sample"


@stage_task(STAGE)
def rejection_sample(config: PipelineConfig | dict[str, Any], run: str, store: str | None = None,
                     inputs: dict[str, StageRef] | None = None, force: bool = False) -> StageRef:
    ctx = StageContext.open(config, run, store, STAGE)
    try:
        data, rl = (inputs or {})["prepare_data"], (inputs or {})["grpo_train"]
        parents = {"prepare_data": data, "grpo_train": rl}
        section = ctx.config.rejection_sample
        fp = fingerprint(STAGE, section, parents)
        if (ref := ctx.reuse(fp, force)) is not None:
            return cached(ref, "same config and inputs")
        rows = read_parquet(ctx.fetch(data, "train.parquet"))
        kept, stats = _sample(ctx, str(ctx.fetch(rl, "model")), rows)
        out = ctx.work / "out"
        write_parquet(kept, out / "samples.parquet")
        write_parquet(stats.pop("per_prompt"), out / "pass_rates.parquet")
        with ctx.begin() as writer:
            writer.put_dir(out)
            return commit_stage(ctx, writer, fp=fp, section=section, parents=parents, metrics=stats)
    finally:
        ctx.cleanup()


def _sample(ctx: StageContext, model_path: str, rows: list[dict[str, Any]]) -> tuple[list[dict[str, Any]], dict]:
    """Sample with the same backend kind the GRPO stage used (vLLM for real runs, transformers for tiny)."""
    import torch
    from transformers import AutoConfig, AutoTokenizer

    from grpo_core.generation import backend_kind, make_backend
    from grpo_core.rejection import rejection_sample_with_config
    from grpo_core.trainer.loop import backend_options

    grpo = ctx.config.grpo_train
    kind = backend_kind(grpo.use_vllm)
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    tokenizer = AutoTokenizer.from_pretrained(model_path)
    opts = backend_options(grpo, kind, device, AutoConfig.from_pretrained(model_path))
    backend = make_backend(kind, model_path, tokenizer=tokenizer, **opts)
    return rejection_sample_with_config(ctx.config.rejection_sample, backend, tokenizer, rows)
