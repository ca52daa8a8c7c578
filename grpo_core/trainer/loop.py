"""The GRPO training loop: generate, score, advantage, optimise, checkpoint; resumable bit for bit.

A ``step`` is one generation round: ``prompts_per_step`` prompts x ``num_generations`` completions,
then ``steps_per_generation`` (default 1) x ``num_iterations`` optimiser steps on them. ``max_steps``
and ``save_steps`` count these rounds; ``logging_steps`` too (a logged row holds that step's metrics,
not a mean over the N steps). Departures from TRL: ``gradient_accumulation_steps`` is implied
(micro-batches = completions of an optimiser step / ``per_device_train_batch_size``; GRPOConfig refuses
another value), and TRL's ``steps_per_generation`` counts micro-batches where here it counts optimiser steps.

Determinism: prompts come from a seeded stream and every completion's sampling seed is derived from
``(seed, step, stream position, j)``; so a run killed at any step and resumed from its checkpoint
ends with the same weights as one that never stopped, and N processes give the curve of one.

``async_rollouts``: the sampler runs in its own process one step behind (``trainer/async_rollouts.py``).

Over-long prompts (``trainer.prompts.encode_prompts``): under ``long_prompts: truncate`` each step logs
``prompts/truncated``, its generated prompts cut to ``max_prompt_length``; under ``drop`` the rows over the
limit are removed before the prompt stream is built (so every step keeps whole groups, and a resumed run
streams the same rows), and ``prompts/dropped``, logged on every step, is how many were removed.
"""

from __future__ import annotations

import logging
import time
from pathlib import Path
from typing import Any, Callable

import torch
from transformers import AutoTokenizer

from grpo_core.config import GRPOConfig
from grpo_core.generation import backend_kind, backend_options, make_backend, release_memory
from grpo_core.trainer.loss import combine_rewards, compute_group_advantages
from grpo_core.rewards import pop_reward_stats
from grpo_core.rewards.math import configure as configure_verifier
from grpo_core.rewards.scoring import resolve_reward
from grpo_core.trainer.async_rollouts import NextRollouts, ReferenceLogps, split_cpus
from grpo_core.trainer.distributed import gather_objects
from grpo_core.trainer.fsdp import ReplicaBackend, is_sharded
from grpo_core.trainer.metrics import completion_metrics, reward_metrics
from grpo_core.trainer.mixture import Mixture, per_source_scale, source_labels, source_reward_metrics
from grpo_core.trainer.prompts import all_dropped_error, encode_prompts
from grpo_core.trainer.rollouts import collect_step_groups, generate_groups
from grpo_core.trainer.skeleton import (
    TrainingRun,
    load_model,
    load_policy,
    load_trained_model,
    prepare_output_dir,
    seed_everything,
    start_process,
)
from grpo_core.trainer.update import build_train_batch, optimise

logger = logging.getLogger(__name__)

RewardFuncs = list[Any]  # registered names, RewardModelSpec / JudgeSpec entries, callables


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
    resolved = [resolve_reward(f) for f in items]  # names, reward models / judges (loaded here), callables
    funcs, names = [f for f, _ in resolved], [n for _, n in resolved]
    weights = torch.tensor(config.reward_weights, dtype=torch.float32) if config.reward_weights is not None else None
    return funcs, names, weights


def drop_long_prompts(tokenizer: Any, rows: list[dict[str, Any]], config: GRPOConfig
                      ) -> tuple[list[dict[str, Any]], int]:
    """``(rows, num_dropped)``: under ``long_prompts: drop`` the rows whose prompt is longer than
    ``max_prompt_length`` removed (the same for every rank and every restart); else ``rows`` as given."""
    if config.sampling.long_prompts != "drop":
        return rows, 0
    encoded = encode_prompts(tokenizer, [r["prompt"] for r in rows], config.sampling.max_prompt_length, "drop")
    if not encoded.kept:
        raise all_dropped_error("train_grpo", len(rows), config.sampling.max_prompt_length)
    if encoded.num_dropped:
        logger.warning("dropped %d of %d training prompts longer than max_prompt_length (%d tokens)",
                       encoded.num_dropped, len(rows), config.sampling.max_prompt_length)
    return [rows[i] for i in encoded.kept], encoded.num_dropped


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
    ctx = start_process(config)
    if config.async_rollouts and ctx.enabled:  # before any model loads: fail in seconds, not minutes
        raise ValueError(f"async_rollouts runs in one training process for now, and this is rank {ctx.rank} of "
                         f"{ctx.world_size} (torchrun); launch one process (R1_NPROC_PER_NODE=1, one node) or set "
                         "async_rollouts: false")
    output_dir = Path(output_dir)
    if config.sources and reward_funcs is not None:
        raise ValueError("config.sources names each source's reward functions; do not also pass reward_funcs")
    if config.prompts_per_step % ctx.world_size:
        raise ValueError(
            f"prompts_per_step ({config.prompts_per_step} = generation_batch_size / num_generations) must be "
            f"divisible by the number of processes ({ctx.world_size}) so each rank generates whole groups"
        )
    if not train_rows:
        raise ValueError("train_rows is empty: GRPO needs at least one prompt")
    prepare_output_dir(output_dir, ctx, resume)

    seed_everything(config.seed)
    configure_verifier(timeout=config.reward_timeout, num_workers=config.reward_num_workers)  # math_accuracy's pool
    tokenizer = AutoTokenizer.from_pretrained(model_path)
    train_rows, num_dropped = drop_long_prompts(tokenizer, train_rows, config)
    if config.sources:
        unweighted = config.model_copy(update={"reward_weights": None})
        mixture = Mixture(config, train_rows, lambda entries: resolve_rewards(unweighted, entries)[:2])
    else:
        mixture = Mixture(config, train_rows, lambda _: resolve_rewards(config, reward_funcs)[:2])
    names = mixture.reward_names
    model, loaded = load_policy("grpo", model_path, output_dir, config, ctx, resume=resume)
    ref_model = None
    ref_on_sampler = config.beta > 0.0 and config.async_rollouts and config.async_reference_on_sampler
    if config.beta > 0.0 and not ref_on_sampler:  # the reference model exists only when the KL term does
        ref_model = load_trained_model(model_path, config, ctx, trainable=False)  # sharded like the policy
    num_updates = (config.steps_per_generation or 1) * config.num_iterations
    initial = {"step": 0, "stream_position": 0, "optimizer_steps": 0, "log_history": []}
    with TrainingRun.start("grpo", config, ctx, output_dir, model, tokenizer, loaded, max_steps=config.max_steps,
                           optimizer_steps=config.max_steps * num_updates, state=initial, callbacks=callbacks) as run:
        state = run.state
        kind = backend_kind(config.sampling.use_vllm)
        start_path = loaded.path if loaded else model_path
        opts = backend_options(config.sampling, kind, ctx.device, seed=config.seed, bf16=config.bf16,
                               model_config=model.config)
        pad_token_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
        if config.async_rollouts:  # the sampler in its own process (trainer/async_rollouts.py)
            from grpo_core.generation.process import ProcessBackend

            sampler_cpus, trainer_threads = split_cpus(config.async_sampler_threads, ctx.device)
            if trainer_threads is not None:
                torch.set_num_threads(trainer_threads)
            reference = ReferenceLogps(str(model_path), config, pad_token_id, str(ctx.device)) if ref_on_sampler else None
            backend = ProcessBackend(kind, str(start_path), timeout=config.async_sampler_timeout,
                                     torch_num_threads=config.async_sampler_threads, cpus=sampler_cpus,
                                     annotate=reference, **opts)
        elif is_sharded(model) and kind == "hf":  # sample from a full replica: a sharded module decodes only in lockstep
            replica = load_model(start_path, ctx.device).eval().requires_grad_(False)
            backend = ReplicaBackend(make_backend("hf", str(start_path), model=replica, tokenizer=tokenizer, **opts), replica)
        else:
            backend = make_backend(kind, str(start_path), model=model, tokenizer=tokenizer, **opts)
        # The transformers backend on the trainer's own module (same weights, same autocast) reports the
        # trainer's log-probs: its weights would be 1 but for float rounding, so the correction is skipped.
        sampler_is_trainer = kind == "hf" and not is_sharded(model) and not config.async_rollouts
        sampling_correction = config.vllm_importance_sampling_correction and not sampler_is_trainer
        next_rollouts = None
        if config.async_rollouts:  # the rounds a checkpoint carries (generated with weights older than it)
            next_rollouts = NextRollouts(backend, tokenizer, mixture, config, ctx)
            next_rollouts.load_state(state.pop("next_rollouts", []))

        metrics: dict[str, Any] = state["log_history"][-1] if state["log_history"] else {}
        try:
            for step in range(state["step"] + 1, config.max_steps + 1):
                start = time.perf_counter()
                timings: dict[str, float] = {}

                def generate(position: int, count: int) -> Any:
                    if next_rollouts is not None:  # the sampler answers in order: the rounds in flight first
                        next_rollouts.collect(timings)
                    return generate_groups(backend, tokenizer, mixture, position, count, step, config, ctx, timings)

                def combine(g: Any) -> torch.Tensor:  # [P*G] each completion weighted by its own source
                    return combine_rewards(g.rewards_per_func, mixture.row_weights(g.rows, config.sampling.num_generations))

                planned = next_rollouts.take(step) if next_rollouts is not None else None  # async: generated earlier
                first, staleness = (planned[0], step - 1 - planned[1]) if planned else (None, 0)
                groups, generated, position, rounds = collect_step_groups(generate, state["stream_position"], config,
                                                                          combine, first=first)
                if next_rollouts is not None:  # the steps up to k ahead, with the weights the sampler holds: step - 1's
                    for ahead in range(step + 1, min(step + config.async_max_staleness, config.max_steps) + 1):
                        if not next_rollouts.planned(ahead):
                            next_rollouts.submit(position, ahead, version=step - 1)
                            position += config.prompts_per_step
                release_memory(backend)  # vllm_enable_sleep_mode: the engine sleeps until update_weights wakes it
                generated_rewards = combine(generated)  # [P*G]
                _, group_metrics = compute_group_advantages(generated_rewards, config.sampling.num_generations,
                                                            config.scale_rewards)
                rewards = combine(groups)  # [N]
                labels = source_labels(groups.rows, config.sampling.num_generations)  # [N]
                if mixture.mixed and config.scale_rewards == "batch":  # one std per source, not one over the mixture
                    centred, _ = compute_group_advantages(rewards, config.sampling.num_generations, "none")
                    advantages = per_source_scale(centred, rewards, labels)  # [N]
                else:
                    advantages, _ = compute_group_advantages(rewards, config.sampling.num_generations, config.scale_rewards)
                batch = build_train_batch(groups.rollouts, advantages, pad_token_id, config.mask_truncated_completions)
                train_start = time.perf_counter()
                update_metrics = optimise(model, ref_model, run.optimizer, run.scheduler, batch, config, ctx,
                                          sampling_correction=sampling_correction)
                if next_rollouts is not None:  # the next step's round; at a checkpoint every round in flight
                    saves = run.saves_at(step)
                    next_rollouts.collect(timings, until=None if saves else step + 1)
                    if saves:
                        state["next_rollouts"] = next_rollouts.to_state()
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
                    **source_reward_metrics(generated_rewards, source_labels(generated.rows, config.sampling.num_generations),
                                            config.sampling.num_generations),
                    **event_counts,
                    **completion_metrics(generated.rollouts, config.emergence.reflection_phrases,
                                         config.emergence.backtrack_phrases),
                    "prompts/truncated": float(sum(generated.truncated)),
                    "prompts/dropped": float(num_dropped),
                    **update_metrics,
                    "time/generate": timings.get("time/generate", 0.0),
                    "time/reward": timings.get("time/reward", 0.0),
                    "time/train": end - train_start,
                    "time/step": end - start,
                    "tokens_per_second": num_tokens / (end - start),
                }
                if config.async_rollouts:
                    metrics["async/staleness"] = float(staleness)
                    metrics["time/wait_sampler"] = timings.get("time/wait_sampler", 0.0)
                    metrics["time/sampler_generate"] = timings.get("time/sampler_generate", 0.0)
                    metrics["time/sampler_reference"] = timings.get("time/sampler_annotate", 0.0)
                if config.dynamic_sampling:
                    metrics["dynamic_sampling/rounds"] = float(rounds)
                    metrics["dynamic_sampling/kept_groups"] = float(len(groups))
                state["stream_position"] = position
                state["optimizer_steps"] += num_updates
                logger.debug("step %d/%d reward %.3f loss %.4f (%.2fs)", step, config.max_steps,
                             metrics["reward"], metrics["loss"], metrics["time/step"])
                logged = step % config.logging_steps == 0 or step == config.max_steps
                run.end_step(step, metrics if logged else None, loss=metrics["loss"], reward=metrics["reward"],
                             lr=metrics["learning_rate"])
            run.finish(model_path)
        finally:
            if config.async_rollouts:  # the sampler process ends with the stage, failed or not
                backend.close()
    return {"step": state["step"], **{k: v for k, v in metrics.items() if k != "step"}}

