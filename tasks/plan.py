"""The memory plan of a pipeline's GPU stages (``r1 plan``) and the same check before a GPU stage starts.

    r1 plan -c configs/qwen2.5-7b-math.yaml --gpus 8 --gpu-memory 80

The arithmetic is ``grpo_core.memory_plan``; this module maps the pipeline config onto it: which stages run
on the GPU pool (the stage table), which config section sizes each, where the model's shape comes from
(a local folder's config.json, the planner's table of known architectures, or the tiny model's config).
Before a GPU stage's training or sampling starts (CUDA only) ``check_stage_memory`` plans it against
``torch.cuda.mem_get_info`` and fails it at once with the same message ``r1 plan`` prints.
"""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Any

from grpo_core.memory_plan import GiB, Hardware, ModelShape, StagePlan, plan_stage, resolve_model_shape
from tasks.config import PipelineConfig


class StageMemoryError(RuntimeError):
    """A GPU stage whose predicted peak does not fit the device; the message says what would make it fit."""


def model_shape(config: PipelineConfig) -> ModelShape:
    """The base model's shape: its config.json (local folder or known architecture), or the tiny model's."""
    if config.model.tiny is not None:
        from grpo_core.tiny import build_tiny_tokenizer

        t = config.model.tiny
        return ModelShape(hidden_size=t.hidden_size, intermediate_size=3 * t.hidden_size,
                          num_hidden_layers=t.num_layers, num_attention_heads=t.num_heads,
                          num_key_value_heads=t.num_heads, vocab_size=len(build_tiny_tokenizer()),
                          tie_word_embeddings=True, attention_bias=False,
                          max_position_embeddings=t.max_position_embeddings)
    return resolve_model_shape(config.model.name_or_path)


def stage_section(config: PipelineConfig, stage: str, kind: str) -> Any:
    """The config section that sizes ``stage``: its own, or for sampling the RL section whose backend it uses
    with the sampling stage's own prompt and completion lengths (as ``tasks.rejection_sample`` builds it)."""
    if kind != "sampling":
        return getattr(config, stage)
    rs = getattr(config, stage)
    return config.grpo_train.model_copy(update={"max_prompt_length": rs.max_prompt_length,
                                                "max_completion_length": rs.max_new_tokens})


def plan_pipeline(config: PipelineConfig, hw: Hardware, shape: ModelShape | None = None) -> list[StagePlan]:
    """One plan per GPU stage, in pipeline order."""
    from tasks.stages import all_stages

    shape = shape or model_shape(config)
    return [plan_stage(s.name, s.kind, stage_section(config, s.name, s.kind), shape, hw)
            for s in all_stages() if s.pool == "gpu" and s.kind != "reward"]  # the reward model is not sized here


def check_stage_memory(stage: str, kind: str, section: Any, model_path: str | Path, *,
                       gpus: int | None = None, free: int | None = None, total: int | None = None) -> StagePlan | None:
    """Fail fast (``StageMemoryError``) when ``stage`` would not fit its device; None when not on CUDA.

    ``gpus`` defaults to torchrun's ``WORLD_SIZE``; ``free``/``total`` to ``torch.cuda.mem_get_info()``
    (tests inject them). ``kind`` is the stage table's (``sft``, ``rl``, ``sampling``)."""
    if free is None or total is None:
        import torch

        if not torch.cuda.is_available():
            return None
        free, total = torch.cuda.mem_get_info()
    gpus = gpus or int(os.environ.get("WORLD_SIZE", "1"))
    shape = resolve_model_shape(str(model_path))
    plan = plan_stage(stage, kind, section, shape, Hardware(gpus=gpus, gpu_memory=total, free_memory=free))
    if not plan.fits:
        raise StageMemoryError(plan.failure_message())
    return plan


HARDWARE_LINE = re.compile(r"^#\s*hardware:\s*(?:(\d+)x(\d+(?:\.\d+)?)GiB GPU|cpu (\d+(?:\.\d+)?)GiB)\s*$", re.M)


def config_hardware(path: str | Path) -> Hardware:
    """The hardware a config file's header names: ``# hardware: 8x80GiB GPU`` or ``# hardware: cpu 8GiB``."""
    match = HARDWARE_LINE.search(Path(path).read_text())
    if match is None:
        raise ValueError(f"{path}: no header line '# hardware: <N>x<M>GiB GPU' or '# hardware: cpu <M>GiB'")
    gpus, gpu_mem, cpu_mem = match.groups()
    if cpu_mem is not None:
        return Hardware(gpus=1, gpu_memory=int(float(cpu_mem) * GiB), device="cpu")
    return Hardware(gpus=int(gpus), gpu_memory=int(float(gpu_mem) * GiB))
