"""AdamW and its learning-rate schedule from an ``OptimConfig`` (shared by the GRPO and SFT trainers).

As transformers' Trainer: weight decay only on matrices (not on biases or norm weights), and the
schedule from ``transformers.get_scheduler`` (warmup is linear from 0; plain ``constant`` has none).
"""

from __future__ import annotations

import math

import torch
from transformers import get_scheduler

from grpo_core.config import OptimConfig


def build_optimizer(model: torch.nn.Module, config: OptimConfig) -> torch.optim.AdamW:
    decay = [p for p in model.parameters() if p.requires_grad and p.ndim >= 2]
    no_decay = [p for p in model.parameters() if p.requires_grad and p.ndim < 2]
    groups = [{"params": decay, "weight_decay": config.weight_decay}, {"params": no_decay, "weight_decay": 0.0}]
    # One fused kernel over all tensors (transformers' default "adamw_torch_fused") where every parameter is a
    # plain CPU/CUDA tensor; FSDP's DTensor shards take the default implementation.
    fused = all(type(p) is torch.nn.Parameter and p.device.type in ("cpu", "cuda") for p in decay + no_decay)
    return torch.optim.AdamW(
        [g for g in groups if g["params"]],
        lr=config.learning_rate,
        betas=(config.adam_beta1, config.adam_beta2),
        eps=config.adam_epsilon,
        fused=fused or None,
    )


def warmup_steps(config: OptimConfig, total_steps: int) -> int:
    return config.warmup_steps if config.warmup_steps > 0 else math.ceil(config.warmup_ratio * total_steps)


def build_scheduler(optimizer: torch.optim.Optimizer, config: OptimConfig, total_steps: int) -> torch.optim.lr_scheduler.LRScheduler:
    """``total_steps`` counts optimiser steps (for GRPO: max_steps x steps_per_generation x num_iterations)."""
    return get_scheduler(
        config.lr_scheduler_type,
        optimizer,
        num_warmup_steps=warmup_steps(config, total_steps),
        num_training_steps=total_steps,
    )
