"""The GRPO training loop: generate, score, advantage, optimise, checkpoint; resumable bit for bit.

A ``step`` is one generation round: ``prompts_per_step`` prompts x ``num_generations`` completions,
then ``steps_per_generation`` (default 1) x ``num_iterations`` optimiser steps on them. ``max_steps``
and ``save_steps`` count these rounds. Departures from TRL: ``gradient_accumulation_steps`` is
implied (micro-batches = completions of an optimiser step / ``per_device_train_batch_size``), and
TRL's ``steps_per_generation`` counts micro-batches where here it counts optimiser steps.

Determinism: prompts come from a seeded stream and every completion's sampling seed is derived from
``(seed, step, stream position, j)``; so a run killed at any step and resumed from its checkpoint
ends with the same weights as one that never stopped, and N processes give the curve of one.
"""

from __future__ import annotations

import logging
import os
import random
import shutil
import time
from pathlib import Path
from typing import Any, Callable

import numpy as np
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from grpo_core.config import GRPOConfig
from grpo_core.generation import backend_kind, make_backend
from grpo_core.loss import combine_rewards, compute_group_advantages
from grpo_core.rewards import get_reward_funcs, pop_reward_stats
from grpo_core.rewards.math import configure as configure_verifier
from grpo_core.trainer.checkpoint import (
    list_checkpoints,
    load_latest_checkpoint,
    remove_temp_checkpoints,
    save_checkpoint,
    set_rng_state,
)
from grpo_core.trainer.distributed import DistContext, barrier, gather_objects, init_distributed
from grpo_core.trainer.fsdp import (
    ReplicaBackend,
    gather_model_state,
    gather_optimizer_state,
    is_sharded,
    load_optimizer_state,
    shard_model,
)
from grpo_core.trainer.metrics import MetricsWriter, completion_metrics, reward_metrics
from grpo_core.trainer.optim import build_optimizer, build_scheduler
from grpo_core.trainer.prompts import PromptStream
from grpo_core.trainer.rollouts import collect_step_groups, generate_groups
from grpo_core.trainer.update import build_train_batch, optimise

logger = logging.getLogger(__name__)

RewardFuncs = list[str | Callable[..., list[float | None]]]


def resolve_rewards(config: GRPOConfig, reward_funcs: RewardFuncs | None) -> tuple[list[Callable], list[str], torch.Tensor | None]:
    """Functions, their metric names and weights; names resolve through the reward registry."""
    items = list(config.reward_funcs if reward_funcs is None else reward_funcs)
    if not items:
        raise ValueError("no reward functions: set config.reward_funcs or pass reward_funcs=[...]")
    if config.reward_weights is not None and len(config.reward_weights) != len(items):
        raise ValueError(
            f"reward_weights has {len(config.reward_weights)} entries but {len(items)} reward functions were "
            "given; pass one weight per function or set reward_weights=None"
        )
    funcs = [get_reward_funcs([f])[0] if isinstance(f, str) else f for f in items]
    names = [f if isinstance(f, str) else getattr(f, "__name__", f"reward_{i}") for i, f in enumerate(items)]
    weights = torch.tensor(config.reward_weights, dtype=torch.float32) if config.reward_weights is not None else None
    return funcs, names, weights


def seed_everything(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)


def _load_model(path: Path | str, device: torch.device) -> torch.nn.Module:
    return AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).to(device)


def backend_options(config: GRPOConfig, kind: str, device: torch.device, model_config: Any = None) -> dict[str, Any]:
    """``make_backend`` keyword arguments for ``kind`` ("hf" or "vllm", see ``backend_kind``) from the GRPO
    config (``model_config``: the policy's transformers config, whose ``max_position_embeddings`` caps vLLM's
    context)."""
    if kind == "hf":
        return {"autocast_dtype": torch.bfloat16 if config.bf16 and device.type == "cuda" else None}
    max_model_len = config.max_prompt_length + config.max_completion_length
    positions = getattr(model_config, "max_position_embeddings", None)
    if positions and max_model_len > positions:  # vLLM refuses a longer context than the model has positions for
        logger.info("vLLM max_model_len %d capped at the model's max_position_embeddings %d", max_model_len, positions)
        max_model_len = positions
    return {
        "max_model_len": max_model_len,
        "gpu_memory_utilization": config.vllm_gpu_memory_utilization,
        "tensor_parallel_size": config.vllm_tensor_parallel_size,
        "kv_cache_memory_bytes": config.vllm_kv_cache_memory_bytes,
        "seed": config.seed,
    }


def _call(callbacks: list[Any], method: str, *args: Any) -> None:
    for cb in callbacks:
        fn = getattr(cb, method, None)
        if fn is not None:
            fn(*args)


def train_grpo(
    config: GRPOConfig,
    model_path: str | Path,
    train_rows: list[dict[str, Any]],
    output_dir: str | Path,
    *,
    reward_funcs: RewardFuncs | None = None,
    resume: bool = True,
    callbacks: list[Any] | None = None,
) -> dict[str, Any]:
    """Train ``model_path`` with GRPO on ``train_rows`` (``{"prompt": messages | str, ...columns}``).

    Writes checkpoints, ``metrics.jsonl``, TensorBoard events and ``final/`` (model + tokenizer) under
    ``output_dir``; returns the last step's metrics. Under ``torchrun`` the processes split each step.
    """
    ctx = init_distributed()
    if config.torch_num_threads:
        torch.set_num_threads(config.torch_num_threads)
    output_dir = Path(output_dir)
    callbacks = list(callbacks or [])
    funcs, names, weights = resolve_rewards(config, reward_funcs)
    if config.prompts_per_step % ctx.world_size:
        raise ValueError(
            f"prompts_per_step ({config.prompts_per_step} = generation_batch_size / num_generations) must be "
            f"divisible by the number of processes ({ctx.world_size}) so each rank generates whole groups"
        )
    if config.gradient_accumulation_steps != 1:
        logger.warning("gradient_accumulation_steps is ignored by GRPO: micro-batches follow from "
                       "generation_batch_size / per_device_train_batch_size")
    if not train_rows:
        raise ValueError("train_rows is empty: GRPO needs at least one prompt")
    if ctx.is_main:
        output_dir.mkdir(parents=True, exist_ok=True)
        remove_temp_checkpoints(output_dir)
        if not resume:  # starting over: an old run's later checkpoints would outrank the new ones
            old = [p for _, p in list_checkpoints(output_dir)] + [p for p in [output_dir / "final"] if p.exists()]
            if old:
                logger.warning("resume=False: removing %s from a previous run", [p.name for p in old])
            for path in old:
                shutil.rmtree(path)
    barrier(ctx)

    seed_everything(config.seed)
    configure_verifier(timeout=config.reward_timeout, num_workers=config.reward_num_workers)  # math_accuracy's pool
    tokenizer = AutoTokenizer.from_pretrained(model_path)
    fsdp = config.distributed_strategy == "fsdp" and ctx.enabled  # one process: nothing to shard over
    if config.distributed_strategy == "fsdp" and not fsdp:
        logger.info("distributed_strategy='fsdp' in a single process: training unsharded")
    load_device = torch.device("cpu") if fsdp else ctx.device  # fully_shard moves each shard to ctx.device
    loaded = load_latest_checkpoint(output_dir, lambda p: _load_model(p, load_device)) if resume else None
    model = loaded.model if loaded else _load_model(model_path, load_device)
    model.train()
    if config.gradient_checkpointing:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    if fsdp:
        model = shard_model(model, ctx, bf16=config.bf16)
    ref_model = None
    if config.beta > 0.0:  # the reference model exists only when the KL term does
        ref_model = _load_model(model_path, load_device).eval().requires_grad_(False)
        if fsdp:
            ref_model = shard_model(ref_model, ctx, bf16=config.bf16)
    num_updates = (config.steps_per_generation or 1) * config.num_iterations
    optimizer = build_optimizer(model, config)
    scheduler = build_scheduler(optimizer, config, config.max_steps * num_updates)
    state: dict[str, Any] = {"step": 0, "stream_position": 0, "optimizer_steps": 0, "log_history": []}
    if loaded:
        if fsdp:
            load_optimizer_state(optimizer, loaded.optimizer)
        else:
            optimizer.load_state_dict(loaded.optimizer)
        scheduler.load_state_dict(loaded.scheduler)
        set_rng_state(loaded.rng)
        state = loaded.trainer_state
        changed = sorted(k for k, v in config.model_dump(mode="json").items() if loaded.config.get(k) != v)
        if changed:
            logger.warning("resuming %s with a changed config: %s", loaded.path, changed)
        logger.info("resumed from %s at step %d", loaded.path, state["step"])

    kind = backend_kind(config.use_vllm)
    start_path = loaded.path if loaded else model_path
    opts = backend_options(config, kind, ctx.device, model.config)
    if fsdp and kind == "hf":  # sample from a full replica: a sharded module decodes only in lockstep
        replica = _load_model(start_path, ctx.device).eval().requires_grad_(False)
        backend = ReplicaBackend(make_backend("hf", str(start_path), model=replica, tokenizer=tokenizer, **opts), replica)
    else:
        backend = make_backend(kind, str(start_path), model=model, tokenizer=tokenizer, **opts)
    pad_token_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
    stream = PromptStream(len(train_rows), config.seed)
    writer = MetricsWriter(output_dir, config.report_to, state["log_history"], state["step"]) if ctx.is_main else None
    config_json = config.model_dump(mode="json")

    metrics: dict[str, Any] = state["log_history"][-1] if state["log_history"] else {}
    try:
        for step in range(state["step"] + 1, config.max_steps + 1):
            start = time.perf_counter()
            timings: dict[str, float] = {}

            def generate(position: int, count: int) -> Any:
                return generate_groups(backend, tokenizer, train_rows, stream, position, count, step, config,
                                       funcs, names, ctx, timings)

            groups, generated, position, rounds = collect_step_groups(generate, state["stream_position"], config, weights)
            _, group_metrics = compute_group_advantages(
                combine_rewards(generated.rewards_per_func, weights), config.num_generations, config.scale_rewards
            )
            advantages, _ = compute_group_advantages(
                combine_rewards(groups.rewards_per_func, weights), config.num_generations, config.scale_rewards
            )  # [N]
            batch = build_train_batch(groups.rollouts, advantages, pad_token_id, config.mask_truncated_completions)
            train_start = time.perf_counter()
            update_metrics = optimise(model, ref_model, optimizer, scheduler, batch, config, ctx)
            backend.update_weights(model)  # the next step samples from the updated policy
            end = time.perf_counter()

            event_counts: dict[str, float] = {}
            for part in gather_objects([pop_reward_stats()], ctx):
                for k, v in part.items():
                    event_counts[k] = event_counts.get(k, 0.0) + v
            num_tokens = sum(len(r.prompt_ids) + len(r.completion_ids) for r in generated.rollouts)
            metrics = {
                **group_metrics,
                **reward_metrics(generated.rewards_per_func, names),
                **event_counts,
                **completion_metrics(generated.rollouts),
                **update_metrics,
                "time/generate": timings.get("time/generate", 0.0),
                "time/reward": timings.get("time/reward", 0.0),
                "time/train": end - train_start,
                "time/step": end - start,
                "tokens_per_second": num_tokens / (end - start),
            }
            if config.dynamic_sampling:
                metrics["dynamic_sampling/rounds"] = float(rounds)
                metrics["dynamic_sampling/kept_groups"] = float(len(groups))
            state["step"] = step
            state["stream_position"] = position
            state["optimizer_steps"] += num_updates
            state["log_history"].append({"step": step, **metrics})
            if ctx.is_main:
                writer.write(step, metrics)
                logger.info("step %d/%d reward %.3f loss %.4f (%.2fs)", step, config.max_steps,
                            metrics["reward"], metrics["loss"], metrics["time/step"])
                _call(callbacks, "on_step", step, config.max_steps, metrics)
            if step % config.save_steps == 0 or step == config.max_steps:
                full_model, full_optim = None, None
                if is_sharded(model):  # every rank joins the gathers; rank 0 writes
                    full_model, full_optim = gather_model_state(model), gather_optimizer_state(optimizer, ctx)
                if ctx.is_main:
                    path = save_checkpoint(
                        output_dir, step, model=model, tokenizer=tokenizer, optimizer=optimizer, scheduler=scheduler,
                        trainer_state=state, config=config_json, save_total_limit=config.save_total_limit,
                        model_state_dict=full_model, optimizer_state_dict=full_optim,
                    )
                    _call(callbacks, "on_checkpoint", step, path)
                barrier(ctx)
        full_model = gather_model_state(model) if is_sharded(model) else None
        if ctx.is_main:
            save_final_model(model, tokenizer, output_dir / "final", state_dict=full_model)
        barrier(ctx)
    finally:
        if writer is not None:
            writer.close()
    return {"step": state["step"], **{k: v for k, v in metrics.items() if k != "step"}}


def save_final_model(model: torch.nn.Module, tokenizer: Any, path: Path, state_dict: dict[str, torch.Tensor] | None = None) -> None:
    """``save_pretrained`` model (or ``state_dict``, gathered from shards) and tokenizer into ``path``, atomically."""
    tmp = path.with_name(f".tmp-{path.name}")
    shutil.rmtree(tmp, ignore_errors=True)
    model.save_pretrained(tmp, safe_serialization=True, state_dict=state_dict)
    tokenizer.save_pretrained(tmp)
    if path.exists():
        shutil.rmtree(path)
    os.rename(tmp, path)
