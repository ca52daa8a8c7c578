"""The GRPO training loop: generate, score, advantages, optimise, log, save; resumable bit for bit.

``train_grpo`` sets up once (checks, rows, mixture, policy, reference, sampler) and then each step is one call
per phase on ``GRPOSteps`` (``trainer/step.py``).

A ``step`` is one generation round: ``prompts_per_step`` prompts x ``num_generations`` completions,
then ``steps_per_generation`` (default 1) x ``num_iterations`` optimiser steps on them. ``max_steps``
and ``save_steps`` count these rounds; ``logging_steps`` too (a logged row holds that step's metrics,
not a mean over the N steps). Departures from TRL: ``gradient_accumulation_steps`` is implied
(micro-batches = completions of an optimiser step / ``per_device_train_batch_size``; GRPOConfig refuses
another value), and TRL's ``steps_per_generation`` counts micro-batches where here it counts optimiser steps.

Determinism: prompts come from a seeded stream and every completion's sampling seed is
``derive_seed(seed, step, stream position, j)`` (``grpo_core/seeds.py``); so a run killed at any step and resumed from its checkpoint
ends with the same weights as one that never stopped, and N processes give the curve of one.

``async_rollouts``: the sampler runs in its own process one step behind (``trainer/async_rollouts.py``).

``sampling.tools``: each completion is a multi-turn trajectory whose tool calls the loaded tools answer
(``trainer/rollouts.py``, ``generation/trajectory.py``), logged per step as ``tools/...``.

Over-long prompts (``generation.prompts.encode_prompts``): under ``long_prompts: truncate`` each step logs
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
from transformers import AutoModelForCausalLM, AutoTokenizer

from grpo_core.config import EvalConfig, GRPOConfig, TrackingInfo, needs_reference
from grpo_core.generation import GenerationBackend, backend_kind, backend_options, make_backend
from grpo_core.generation.process import ProcessBackend
from grpo_core.generation.prompts import all_dropped_error, encode_prompts
from grpo_core.generation.server_client import connect_server
from grpo_core.generation.trajectory import tool_call_close_id
from grpo_core.rewards.math import configure as configure_verifier
from grpo_core.rewards.reward_model import share_moments
from grpo_core.rewards.scoring import resolve_reward
from grpo_core.tools import ToolSet
from grpo_core.trainer.async_rollouts import (NextRollouts, ReferenceLogps, ToolRollouts, sampler_placement,
                                              split_cpus)
from grpo_core.trainer.distributed import DistContext
from grpo_core.trainer.during_rl import heldout_slice, rl_eval_config
from grpo_core.trainer.fsdp import ReplicaBackend, is_sharded
from grpo_core.trainer.lora import MergedReplica, base_dtype
from grpo_core.trainer.mixture import Mixture
from grpo_core.trainer.monitor import build_monitor
from grpo_core.trainer.selection import finish_monitor, select_checkpoint
from grpo_core.trainer.server_ranks import RankZeroServer, warn_server_placement
from grpo_core.trainer.sharded_state import has_sharded_state
from grpo_core.trainer.skeleton import (
    TrainingRun,
    load_model,
    load_policy,
    load_trained_model,
    prepare_output_dir,
    seed_everything,
    start_process,
)
from grpo_core.trainer.step import GRPOSteps, HeldOut

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


def drop_long_prompts(tokenizer: Any, rows: list[dict[str, Any]], config: GRPOConfig, tools: ToolSet | None = None
                      ) -> tuple[list[dict[str, Any]], int]:
    """``(rows, num_dropped)``: under ``long_prompts: drop`` the rows whose prompt (with the ``tools``' schemas, as
    rollouts encode it) is longer than ``max_prompt_length`` removed (the same for every rank and every restart);
    else ``rows`` as given."""
    if config.sampling.long_prompts != "drop":
        return rows, 0
    encoded = encode_prompts(tokenizer, [r["prompt"] for r in rows], config.sampling.max_prompt_length, "drop",
                             tools=tools.schemas() if tools is not None else None)
    if not encoded.kept:
        raise all_dropped_error("train_grpo", len(rows), config.sampling.max_prompt_length)
    if encoded.num_dropped:
        logger.warning("dropped %d of %d training prompts longer than max_prompt_length (%d tokens)",
                       encoded.num_dropped, len(rows), config.sampling.max_prompt_length)
    return [rows[i] for i in encoded.kept], encoded.num_dropped


def check_inputs(config: GRPOConfig, ctx: DistContext, train_rows: list[dict[str, Any]],
                 reward_funcs: RewardFuncs | None) -> None:
    """Refuse what cannot train, before any model loads (fail in seconds, not minutes)."""
    if ctx.is_main:
        warn_server_placement(config, ctx)  # one GPU generating, the others training
    if config.use_peft and config.async_rollouts:
        raise ValueError("use_peft with async_rollouts is not supported yet: the sampler process cannot report its "
                         "weights for the sync check; set async_rollouts: false (or use_peft: false)")
    if config.sources and reward_funcs is not None:
        raise ValueError("config.sources names each source's reward functions; do not also pass reward_funcs")
    if config.prompts_per_step % ctx.world_size:
        raise ValueError(
            f"prompts_per_step ({config.prompts_per_step} = generation_batch_size / num_generations) must be "
            f"divisible by the number of processes ({ctx.world_size}) so each rank generates whole groups"
        )
    if not train_rows:
        raise ValueError("train_rows is empty: GRPO needs at least one prompt")


def load_rollout_tools(config: GRPOConfig) -> ToolSet | None:
    """The tools of multi-turn rollouts (``sampling.tools``), loaded before any model so that a spec that does not
    load fails in seconds, naming the field; None without tools (single-turn rollouts, as before)."""
    # python's sandbox check runs here, where rollouts run
    return ToolSet.from_specs(config.sampling.tools, field="sampling.tools") if config.sampling.tools else None


def build_mixture(config: GRPOConfig, train_rows: list[dict[str, Any]], reward_funcs: RewardFuncs | None,
                  ctx: DistContext) -> Mixture:
    """The run's sources with their reward functions (one source of every row without ``config.sources``). Under
    several processes each rank scores its share of a step, so a reward model's running moments (``normalize``)
    merge every rank's scores (``reward_model.share_moments``): N processes normalise as one does."""
    if config.sources:  # each source's functions, weighted by the source (not by the top-level reward_weights)
        unweighted = config.model_copy(update={"reward_weights": None})
        mixture = Mixture(config, train_rows, lambda entries: resolve_rewards(unweighted, entries)[:2])
    else:
        mixture = Mixture(config, train_rows, lambda _: resolve_rewards(config, reward_funcs)[:2])
    if ctx.world_size > 1:
        for func in mixture.funcs:
            share_moments(func)
    return mixture


def reference_on_sampler(config: GRPOConfig) -> bool:
    """Whether the sampler process computes the reference log-probs (then the trainer holds no reference)."""
    return needs_reference(config) and config.async_rollouts and config.async_reference_on_sampler


def make_sampler(config: GRPOConfig, ctx: DistContext, model: torch.nn.Module, tokenizer: Any,
                 model_path: str | Path, start_path: str | Path, output_dir: Path | None = None
                 ) -> tuple[GenerationBackend, bool]:
    """``(backend, sampling_correction)``: the generation backend on the policy's weights (``start_path``: where
    they were loaded from) and whether its log-probs differ from the trainer's (then the loss is corrected).
    ``sampling.vllm_mode: server``: a client of the generation server (started here, its log in ``output_dir``,
    unless ``vllm_server_base_url`` names a running one; with several trainer processes rank 0's, serving all of
    them: ``RankZeroServer``); ``GRPOSteps`` pushes the policy and checks it before step 1.
    A sharded checkpoint is no ``from_pretrained`` folder: the backend starts from ``model_path`` and is then sent
    the policy's weights, as after every update."""
    push_now = has_sharded_state(start_path)
    start_path = model_path if push_now else start_path
    if config.sampling.vllm_mode == "server":  # rollouts on a generation server (generation/server_client.py)

        opts = backend_options(config.sampling, "vllm", ctx.device, seed=config.seed, model_config=model.config)

        def connect() -> GenerationBackend:
            return connect_server(config.sampling, str(start_path), log_dir=Path(output_dir or "."), opts=opts)

        if ctx.enabled:  # several trainer processes: rank 0 talks to the server for all (trainer/server_ranks.py)
            return RankZeroServer(connect, ctx), config.vllm_importance_sampling_correction
        return connect(), config.vllm_importance_sampling_correction  # the server's log-probs are not the trainer's
    kind = backend_kind(config.sampling.use_vllm)
    opts = backend_options(config.sampling, kind, ctx.device, seed=config.seed, bf16=config.bf16,
                           model_config=model.config)
    if config.async_rollouts:  # the sampler in its own process (trainer/async_rollouts.py)

        dtype, device = sampler_placement(config, next(model.parameters()).dtype, ctx.device)
        opts = backend_options(config.sampling, kind, device, seed=config.seed, bf16=config.bf16,
                               model_config=model.config)  # autocast follows the sampler's device
        if kind == "vllm" and config.async_sampler_dtype != "auto":
            opts["dtype"] = config.async_sampler_dtype
        sampler_cpus, trainer_threads = split_cpus(config.async_sampler_threads, device)
        if trainer_threads is not None:
            torch.set_num_threads(trainer_threads)
        pad_token_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
        reference = ReferenceLogps(str(model_path), config, pad_token_id, str(device)) if reference_on_sampler(config) else None
        sampling = config.sampling  # with tools the sampler builds the trajectories of the rounds it makes ahead
        rollout = ToolRollouts(sampling.tools, str(model_path), sampling.max_turns,
                               sampling.max_completion_length) if sampling.tools else None
        backend: GenerationBackend = ProcessBackend(kind, str(start_path), dtype=dtype, device=device,
                                                    timeout=config.async_sampler_timeout,
                                                    torch_num_threads=config.async_sampler_threads, cpus=sampler_cpus,
                                                    annotate=reference, rollout=rollout, **opts)
    elif config.use_peft:  # LoRA: the sampler holds the merged weights, pushed and checked (trainer/weight_sync.py)
        backend = lora_sampler(kind, model_path, ctx.device, tokenizer, opts)
    elif is_sharded(model) and kind == "hf":  # sample from a full replica: a sharded module decodes only in lockstep
        replica = load_model(start_path, ctx.device).eval().requires_grad_(False)
        backend = ReplicaBackend(make_backend("hf", str(start_path), model=replica, tokenizer=tokenizer, **opts), replica)
    else:
        backend = make_backend(kind, str(start_path), model=model, tokenizer=tokenizer, **opts)
    if push_now:
        backend.update_weights(model)
    # The transformers backend on the trainer's own module (same weights, same autocast) reports the
    # trainer's log-probs: its weights would be 1 but for float rounding, so the correction is skipped.
    sampler_is_trainer = kind == "hf" and not is_sharded(model) and not config.async_rollouts and not config.use_peft
    return backend, config.vllm_importance_sampling_correction and not sampler_is_trainer


def lora_sampler(kind: str, model_path: str | Path, device: torch.device, tokenizer: Any,
                 opts: dict[str, Any]) -> GenerationBackend:
    """A LoRA run's sampler, built from the base (a checkpoint holds only adapters); ``GRPOSteps`` pushes the
    merged weights into it before the first step. The transformers sampler gets a replica of its own."""
    if kind == "vllm":
        return make_backend("vllm", str(model_path), tokenizer=tokenizer, **opts)
    replica = AutoModelForCausalLM.from_pretrained(model_path, dtype=base_dtype(model_path, device))
    replica = replica.to(device).eval().requires_grad_(False)
    return MergedReplica(make_backend("hf", str(model_path), model=replica, tokenizer=tokenizer, **opts), replica)


def train_grpo(
    config: GRPOConfig,
    model_path: str | Path,
    train_rows: list[dict[str, Any]],
    output_dir: str | Path,
    *,
    reward_funcs: RewardFuncs | None = None,
    resume: bool = True,
    callbacks: list[Any] | None = None,
    eval_rows: list[dict[str, Any]] | None = None,
    eval_config: EvalConfig | None = None,
    tracking: TrackingInfo | None = None,
) -> dict[str, Any]:
    """Train ``model_path`` with GRPO on ``train_rows`` (``{"prompt": messages | str, ...columns}``).

    Each of ``config.max_steps`` steps is one call per phase on ``GRPOSteps`` (``trainer/step.py``): generate
    ``prompts_per_step`` x G completions, score them, group-relative advantages, optimise
    (``trainer/update.py``, the loss in ``trainer/loss.py``), log, evaluate (``eval_steps``), log completions
    (``log_completions_steps``), save. Writes checkpoints, ``metrics.jsonl``, TensorBoard events and ``final/``
    (model + tokenizer) under ``output_dir``. Under ``torchrun`` the processes split each step; a run killed at any
    step and resumed from its checkpoint ends with the same weights as one that never stopped.

    Example:
        ```python
        from grpo_core.config import GRPOConfig
        from grpo_core.trainer.loop import train_grpo

        rows = [{"prompt": "What is 2 + 3?", "answer": "5"}]
        config = GRPOConfig(max_steps=10, reward_funcs=["math_accuracy", "format"])
        metrics = train_grpo(config, "/models/base", rows, "runs/grpo")
        ```

    Args:
        config: the trainer's settings (the pipeline's ``grpo_train`` / ``final_rl`` section).
        model_path: a local Hugging Face model folder (or hub name) to start from; also the reference model when
            ``config.beta > 0``.
        train_rows: prompt rows; every column besides ``prompt`` reaches the reward functions as a keyword
            (``answer``, ``tests``, ``source``, ...).
        output_dir: where checkpoints, ``metrics.jsonl``, TensorBoard events and ``final/`` go.
        reward_funcs: overrides ``config.reward_funcs``: registered names, ``RewardModelSpec`` / ``JudgeSpec``
            entries or callables under TRL's contract (``grpo_core.rewards.base.RewardFunc``); not with
            ``config.sources``, whose sources name their own.
        resume: continue from the newest checkpoint in ``output_dir`` (False: start over).
        callbacks: objects whose ``on_step(step, max_steps, metrics)``, ``on_checkpoint(step, path)`` and
            ``on_alarm(alarm)`` methods, where they have them, are called as training goes (the pipeline uploads
            each checkpoint to the store this way).
        eval_rows: held-out ``{prompt, answer, ...}`` rows for ``config.eval_steps`` (required when it is set).
        eval_config: how ``eval_rows`` are scored (the pipeline passes its ``evaluate`` section; the lengths
            are the GRPO section's, ``grpo_core.trainer.during_rl.rl_eval_config``); None = an ``EvalConfig``
            scored by the first registered reward ``config`` names.
        tracking: names the run for the trackers of ``config.report_to`` (W&B, MLflow, Trackio).

    Returns:
        The last step's metrics (``step``, ``loss``, ``reward``, ``completions/...``, ...), with the
            reward-hacking monitor's summary and the checkpoint selection when ``eval_steps`` ran them.

    Raises:
        ValueError: inputs that cannot train, before any model loads: no rows or no reward functions,
            ``eval_steps`` without ``eval_rows``, ``prompts_per_step`` not divisible by the number of processes,
            ``reward_funcs`` beside ``config.sources``, every prompt dropped by ``long_prompts: drop``, a
            ``sampling.tools`` spec that does not load, or tools with a tokenizer that splits ``</tool_call>``.
        FloatingPointError: a non-finite loss (not retried by the pipeline).
    """
    ctx = start_process(config)
    check_inputs(config, ctx, train_rows, reward_funcs)
    heldout = None
    if config.eval_steps is not None:
        if not eval_rows:
            raise ValueError("eval_steps is set but no held-out rows were given: pass eval_rows=[{prompt, answer}, "
                             "...] to train_grpo (the pipeline passes prepare_data's eval.parquet) or remove eval_steps")
        eval_cfg = rl_eval_config(config, eval_config)
        general = eval_config.general_sources if eval_config is not None else []
        heldout = HeldOut(eval_cfg, heldout_slice(eval_rows, config.eval_samples, general))
    output_dir = Path(output_dir)
    prepare_output_dir(output_dir, ctx, resume)
    seed_everything(config.seed)
    configure_verifier(timeout=config.reward_timeout, num_workers=config.reward_num_workers)  # math_accuracy's pool
    tools = load_rollout_tools(config)
    tokenizer = AutoTokenizer.from_pretrained(model_path)
    if tools is not None:  # a tool call must end a model turn: </tool_call> one token (a clear error otherwise)
        tool_call_close_id(tokenizer)
    train_rows, num_dropped = drop_long_prompts(tokenizer, train_rows, config, tools)
    mixture = build_mixture(config, train_rows, reward_funcs, ctx)

    if heldout is not None:  # the reward-hacking monitor on the general sources' held-out rows

        heldout.monitor = build_monitor(config, eval_config, eval_rows or [], mixture)
    model, loaded = load_policy("grpo", model_path, output_dir, config, ctx, resume=resume)
    ref_model = None
    if needs_reference(config) and not reference_on_sampler(config) and not config.use_peft:  # the KL term is on
        # (under use_peft the reference is the policy with its adapter disabled: trainer/lora.py reference_view)
        ref_model = load_trained_model(model_path, config, ctx, trainable=False)  # sharded like the policy
    num_updates = (config.steps_per_generation or 1) * config.num_iterations
    initial = {"step": 0, "stream_position": 0, "optimizer_steps": 0, "log_history": []}
    with TrainingRun.start("grpo", config, ctx, output_dir, model, tokenizer, loaded, max_steps=config.max_steps,
                           optimizer_steps=config.max_steps * num_updates, state=initial, callbacks=callbacks,
                           tracking=tracking) as run:
        state = run.state
        backend, sampling_correction = make_sampler(config, ctx, model, tokenizer, model_path,
                                                    loaded.path if loaded else model_path, output_dir)
        next_rollouts = None
        if config.async_rollouts:  # the rounds a checkpoint carries (generated with weights older than it)
            next_rollouts = NextRollouts(backend, tokenizer, mixture, config, ctx,  # type: ignore[arg-type]
                                         tools=tools)
            next_rollouts.load_state(state.pop("next_rollouts", []))
        steps = GRPOSteps(config, ctx, run, model, ref_model, tokenizer, mixture, backend, next_rollouts,
                          sampling_correction=sampling_correction, num_dropped=num_dropped, heldout=heldout,
                          tools=tools)
        metrics: dict[str, Any] = state["log_history"][-1] if state["log_history"] else {}
        try:
            for step in range(state["step"] + 1, config.max_steps + 1):
                start, timings = time.perf_counter(), {}
                rollouts = steps.generate(step, timings)  # prompts -> G completions each, scored
                rewards = steps.score(rollouts)  # combined per completion with its source's weights
                advantages, group_metrics = steps.advantages(rollouts, rewards)
                update_metrics = steps.optimise(step, rollouts, advantages, timings)
                metrics = steps.log(rollouts, rewards, group_metrics, update_metrics, timings, start)
                metrics.update(steps.evaluate(step))  # eval_steps: the held-out slice, no training RNG drawn
                steps.log_completions(step, rollouts, rewards)  # log_completions_steps: a table of the completions
                steps.save(step, rollouts, metrics)
            final = run.finish(model_path)
            selection = select_checkpoint(run, config, ctx, model_path, final)  # select_checkpoint: heldout
            monitor = heldout.monitor if heldout is not None else None
            summary = finish_monitor(run, config, monitor.signal_name, selection) if monitor is not None else {}
        finally:
            if config.async_rollouts or config.sampling.vllm_mode == "server":  # the sampler process (a server the
                backend.close()  # stage started) ends with the stage, failed or not
    return {"step": state["step"], **{k: v for k, v in metrics.items() if k != "step"}, **summary, **selection}
