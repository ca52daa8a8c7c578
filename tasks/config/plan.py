"""The memory plan of a pipeline's GPU stages (``r1 plan``) and the same check before a GPU stage starts.

    r1 plan -c configs/qwen2.5-7b-math.yaml --gpus 8 --gpu-memory 80

The arithmetic is ``grpo_core.plan.memory``; this module maps the pipeline config onto it: which stages run
on the GPU pool (the stage table), which config section sizes each, where the model's shape comes from
(a local folder's config.json, the planner's table of known architectures, or the tiny model's config), and
which reward models and judges each stage loads (``stage_scorers``; evaluation's ``rm_reward`` too: evaluation
runs after every stage that makes a model, on the same GPUs, and is planned as its own row).
Before a GPU stage's training or sampling starts (CUDA only) ``check_stage_memory`` plans it against
``torch.cuda.mem_get_info`` and fails it at once with the same message ``r1 plan`` prints.
"""

from __future__ import annotations

import logging
import os
import re
from pathlib import Path
from typing import Any

from pydantic import BaseModel

from grpo_core.config import JudgeSpec, RewardModelSpec
from grpo_core.plan.memory import GiB, Hardware, ModelShape, StagePlan, plan_stage, resolve_model_shape
from grpo_core.plan.scorers import Scorer
from tasks.config.pipeline import PipelineConfig
from tasks.config.sections import walk_fields
from tasks.config.stages import all_stages, evaluation

logger = logging.getLogger(__name__)


class StageMemoryError(RuntimeError):
    """A GPU stage whose predicted peak does not fit the device; the message says what would make it fit."""


def model_shape(config: PipelineConfig) -> ModelShape:
    """The base model's shape: its config.json (local folder or known architecture), or the tiny model's."""
    if config.model.tiny is not None:
        # heavy import (torch, transformers): only the embedded default's tokenizer is built
        from grpo_core.models.tiny import build_tiny_tokenizer

        t = config.model.tiny
        return ModelShape(hidden_size=t.hidden_size, intermediate_size=3 * t.hidden_size,
                          num_hidden_layers=t.num_layers, num_attention_heads=t.num_heads,
                          num_key_value_heads=t.num_heads, vocab_size=len(build_tiny_tokenizer()),
                          tie_word_embeddings=True, attention_bias=False,
                          max_position_embeddings=t.max_position_embeddings)
    return resolve_model_shape(config.model.name_or_path)


def stage_section(config: PipelineConfig, stage: str, kind: str) -> Any:
    """The config section that sizes ``stage``: its own; a sampling stage's (rejection sampling, evaluation) holds
    its backend settings in its ``sampling``."""
    return config.evaluate if stage == evaluation().name else getattr(config, stage)


def section_scorers(section: BaseModel, kind: str, shape_of: Any) -> list[Scorer]:
    """The reward models and judges ``section`` loads (not those served over ``url``), one per load: an RL stage loads each distinct metric name
    once (``trainer/mixture.py`` keys entries by name, so two names on one path are two copies); a sampling stage
    or evaluation loads every entry in turn. ``shape_of(model)`` sizes an entry's model."""
    specs = [v for v in walk_fields(section) if isinstance(v, (RewardModelSpec, JudgeSpec)) and v.url is None]  # url: served elsewhere
    if kind == "grpo":
        specs = list({s.name: s for s in reversed(specs)}.values())[::-1]  # the first entry of each name
    return [Scorer(s.name, s.type, shape_of(model), s.batch_size, s.max_length, getattr(s, "max_new_tokens", 0),
                   s.device) for s in specs for model in [s.model, *getattr(s, "ensemble", [])]]  # a model per member


def config_shape_of(config: PipelineConfig, base: ModelShape, stage: str) -> Any:
    """``shape_of`` for a config's entries: ``reward_model`` is the run's reward model (the base model's shape,
    or its ``model_name_or_path``'s, under a score head); a path or hub name through ``resolve_model_shape``."""
    def shape_of(model: str) -> ModelShape:
        if model == "reward_model":
            other = config.reward_model.model_name_or_path if config.reward_model is not None else None
            return base if other is None else shape_of(other)
        try:
            return resolve_model_shape(model)
        except ValueError as e:
            raise ValueError(f"{stage}: a reward model / judge entry: {e} (or in its `model:` field)") from None

    return shape_of


def plan_pipeline(config: PipelineConfig, hw: Hardware, shape: ModelShape | None = None) -> list[StagePlan]:
    """One plan per GPU stage the config runs, in pipeline order, then evaluation's when a stage makes a model."""
    shape = shape or model_shape(config)
    stages = [s for s in all_stages() if s.pool == "gpu" and s.enabled(config)]
    return [plan_stage(s.name, s.kind, stage_section(config, s.name, s.kind), shape, hw,
                       section_scorers(s.section_of(config), s.kind, config_shape_of(config, shape, s.name)))
            for s in stages + [evaluation()] * any(s.makes_model for s in stages)]


def check_stage_memory(stage: str, kind: str, section: Any, model_path: str | Path, *,
                       gpus: int | None = None, free: int | None = None, total: int | None = None,
                       scorers_of: BaseModel | None = None) -> StagePlan | None:
    """Fail fast (``StageMemoryError``) when ``stage`` would not fit its device; None when not on CUDA.

    ``gpus`` defaults to torchrun's ``WORLD_SIZE``; ``free``/``total`` to ``torch.cuda.mem_get_info()``
    (tests inject them). ``kind`` is the stage table's (``sft``, ``grpo``, ``reward``, ``sampling``).
    ``scorers_of``: the section whose reward models and judges the stage loads (default ``section``), their paths
    resolved; one whose shape is unknown here (a hub name outside the planner's table) is left out, with a warning."""
    if free is None or total is None:
        import torch

        if not torch.cuda.is_available():
            return None
        free, total = torch.cuda.mem_get_info()
    if gpus is None and kind == "sampling":  # one process; its reward models go to the last GPU it sees
        import torch

        gpus = torch.cuda.device_count() if torch.cuda.is_available() else 1
    gpus = gpus or int(os.environ.get("WORLD_SIZE", "1"))
    shape = resolve_model_shape(str(model_path))
    scorers = section_scorers(scorers_of if scorers_of is not None else section, kind, _known_shape_of)
    plan = plan_stage(stage, kind, section, shape, Hardware(gpus=gpus, gpu_memory=total, free_memory=free),
                      [s for s in scorers if s.shape is not None])
    if not plan.fits:
        raise StageMemoryError(plan.failure_message())
    return plan


def _known_shape_of(model: str) -> ModelShape | None:
    try:
        return resolve_model_shape(model)
    except ValueError as e:
        logger.warning("memory check: %s; its reward model / judge is left out of the plan", e)
        return None


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
