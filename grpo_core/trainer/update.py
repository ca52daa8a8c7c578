"""The optimisation half of a GRPO step: micro-batches, gradient accumulation, optimiser steps.

A step's N training sequences are split into ``steps_per_generation`` chunks, one optimiser step each,
and the chunks are run ``num_iterations`` (mu) times. Within a chunk each rank takes its share of the
sequences in micro-batches of ``per_device_train_batch_size``; every micro-batch loss is divided by
the chunk's GLOBAL sequence/token totals (``compute_policy_loss(num_sequences=, num_tokens=)``), so
the summed gradients over micro-batches and ranks are exactly the full-batch gradient.
``padding_free`` packs each micro-batch's rows into one sequence (``trainer/packing.py``; micro-batches by the
token budget ``max_tokens_per_batch`` when set): the log-probs return in the padded layout, so the loss is unchanged.

Multi-turn tool rollouts (``Rollout.tool_mask``, ``generation/trajectory.py``): the tool turns' tokens are fed like
any completion token (``completion_mask``: the forward, packing, micro-batch budgets) but are 0 in ``loss_mask``
(so the loss, its 1/|o_i| and token totals, and the KL count the model's tokens only) and in ``sampled_mask`` (the
sampler correction and its metrics, the entropy metric).

Old log-probs are computed once before the first update when the batch is reused (mu > 1 or several
optimiser steps per generation); otherwise the ratio is 1 and the loss detaches (TRL does the same).
Reference log-probs exist only when ``beta > 0``; when every rollout carries its own (``Rollout.ref_logprobs``,
computed by the asynchronous sampler process) the batch takes those and no reference forward runs here.

Sampler correction (``optimise(sampling_correction=True)``, TRL's ``vllm_importance_sampling_correction``):
each token's policy term is weighted by ``compute_sampling_correction(old, sampler)``, where ``old`` is
the trainer's log-prob before the update (the old log-probs when computed, else this pass's own values,
detached: the same numbers, without an extra forward). The loop turns it on only when the sampler is not
the trainer's own forward; ``sampling/sampling_logp_difference/*`` is logged whenever the sampler reports
log-probs, ``sampling/importance_sampling_ratio/*`` when the weights are applied.
"""

from __future__ import annotations

import contextlib
import time
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from grpo_core.config import GRPOConfig, needs_reference
from grpo_core.generation import Rollout
from grpo_core.trainer.distributed import DistContext, gather_objects, micro_batches, shard
from grpo_core.trainer.fsdp import is_sharded
from grpo_core.trainer.logprobs import compute_completion_logps, compute_packed_logps, compute_token_logps
from grpo_core.trainer.lora import is_peft_model, reference_view
from grpo_core.trainer.loss import compute_policy_loss, compute_sampling_correction
from grpo_core.trainer.packing import pack_rows, token_budget_batches
from grpo_core.trainer.skeleton import autocast, optimizer_step


@dataclass
class TrainBatch:
    """Padded tensors of a step's training sequences (identical on every rank)."""

    prompt_ids: torch.Tensor  # [N, Lp] left-padded
    prompt_mask: torch.Tensor  # [N, Lp]
    completion_ids: torch.Tensor  # [N, Tc] right-padded
    completion_mask: torch.Tensor  # [N, Tc] 1 on completion tokens, EOS and tool-turn tokens included: what is fed
    loss_mask: torch.Tensor  # [N, Tc] the model's tokens (no tool tokens), without truncated rows when masking them
    advantages: torch.Tensor  # [N]
    sampling_logps: torch.Tensor | None  # [N, Tc] the generation backend's log-probs
    old_logps: torch.Tensor | None = None  # [N, Tc]
    ref_logps: torch.Tensor | None = None  # [N, Tc]
    tool_mask: torch.Tensor | None = None  # [N, Tc] 1 on tool-turn tokens (multi-turn rollouts); None: there are none

    def __len__(self) -> int:
        return self.prompt_ids.shape[0]

    @property
    def sampled_mask(self) -> torch.Tensor:
        """``[N, Tc]`` 1 on the tokens the model sampled: ``completion_mask`` less tool-turn tokens (truncated rows
        kept), where the sampler's log-probs, the sampler correction and the entropy are defined."""
        if self.tool_mask is None:
            return self.completion_mask
        return self.completion_mask * (1 - self.tool_mask)  # [N, Tc]


def build_train_batch(
    rollouts: list[Rollout], advantages: torch.Tensor, pad_token_id: int, mask_truncated: bool
) -> TrainBatch:
    n = len(rollouts)
    lp = max(len(r.prompt_ids) for r in rollouts)
    tc = max(1, max(len(r.completion_ids) for r in rollouts))
    prompt_ids = torch.full((n, lp), pad_token_id, dtype=torch.long)  # [N, Lp]
    prompt_mask = torch.zeros((n, lp), dtype=torch.long)  # [N, Lp]
    completion_ids = torch.full((n, tc), pad_token_id, dtype=torch.long)  # [N, Tc]
    completion_mask = torch.zeros((n, tc), dtype=torch.long)  # [N, Tc]
    has_logps = all(r.logprobs is not None for r in rollouts)
    sampling_logps = torch.zeros((n, tc)) if has_logps else None  # [N, Tc]
    has_ref = all(r.ref_logprobs is not None for r in rollouts)
    ref_logps = torch.zeros((n, tc)) if has_ref else None  # [N, Tc] 0 on padding, as the loss masks it
    has_tools = any(r.tool_mask is not None for r in rollouts)
    tool_mask = torch.zeros((n, tc), dtype=torch.long) if has_tools else None  # [N, Tc]
    for i, r in enumerate(rollouts):
        if r.prompt_ids:
            prompt_ids[i, lp - len(r.prompt_ids) :] = torch.tensor(r.prompt_ids)
            prompt_mask[i, lp - len(r.prompt_ids) :] = 1
        if r.completion_ids:
            completion_ids[i, : len(r.completion_ids)] = torch.tensor(r.completion_ids)
            completion_mask[i, : len(r.completion_ids)] = 1
            if sampling_logps is not None:
                sampling_logps[i, : len(r.completion_ids)] = torch.tensor(r.logprobs)
            if ref_logps is not None:
                ref_logps[i, : len(r.completion_ids)] = torch.tensor(r.ref_logprobs)
            if tool_mask is not None and r.tool_mask is not None:
                tool_mask[i, : len(r.completion_ids)] = torch.tensor(r.tool_mask)
    # Tool-turn tokens are fed (completion_mask) but never trained on: the model did not sample them (Search-R1's
    # retrieved-token masking), so |o_i|, the token totals and the KL count the model's tokens only.
    loss_mask = completion_mask.clone() if tool_mask is None else completion_mask * (1 - tool_mask)  # [N, Tc]
    if mask_truncated:  # DAPO's overlong filtering: a cut-off completion teaches nothing about its ending
        truncated = torch.tensor([r.truncated for r in rollouts])  # [N]
        loss_mask[truncated] = 0
    return TrainBatch(prompt_ids, prompt_mask, completion_ids, completion_mask, loss_mask, advantages, sampling_logps,
                      ref_logps=ref_logps, tool_mask=tool_mask)


def _token_logps(
    model: torch.nn.Module, batch: TrainBatch, idx: list[int], config: GRPOConfig, device: torch.device,
    compute_entropy: bool = False,
) -> tuple[torch.Tensor, torch.Tensor | None, int]:
    """Log-probs (and entropies) ``[b, T']`` of rows ``idx``, trimmed to their own padding, and ``T'``.

    Rows that share a prompt (a GRPO group) run it once (``compute_completion_logps``) unless
    ``share_prompt_forward`` is off, gradient checkpointing is on (no cache in training) or the model is
    FSDP-sharded (one forward per backward keeps its hooks simple). ``padding_free``: the rows packed into one
    sequence (``_packed_token_logps``).
    """
    if config.padding_free:
        return _packed_token_logps(model, batch, idx, config, device, compute_entropy)
    prompt_mask = batch.prompt_mask[idx]  # [b, Lp]
    first = int(prompt_mask.any(0).float().argmax()) if prompt_mask.any() else prompt_mask.shape[1]
    t = max(1, int(batch.completion_mask[idx].sum(1).max()))
    prompt_ids, prompt_mask = batch.prompt_ids[idx, first:], prompt_mask[:, first:]  # [b, Lp']
    completion_ids, completion_mask = batch.completion_ids[idx, :t], batch.completion_mask[idx, :t]  # [b, T']
    kwargs = dict(temperature=config.sampling.temperature, chunk_size=config.logprob_chunk_size, compute_entropy=compute_entropy)
    shared = None
    if config.share_prompt_forward and prompt_ids.shape[1] and not config.gradient_checkpointing and not is_sharded(model):
        shared = torch.unique(torch.cat([prompt_ids, prompt_mask], 1), dim=0, return_inverse=True)
        if len(shared[0]) == len(idx):  # nothing to share
            shared = None
    with autocast(config, device):
        if shared is None:
            input_ids = torch.cat([prompt_ids, completion_ids], 1).to(device)  # [b, Lp'+T']
            attention_mask = torch.cat([prompt_mask, completion_mask], 1).to(device)  # [b, Lp'+T']
            logps, entropy = compute_token_logps(model, input_ids, attention_mask, t, **kwargs)
        else:
            unique, inverse = shared  # [P, 2 Lp'], [b]
            lp = prompt_ids.shape[1]
            logps, entropy = compute_completion_logps(
                model, unique[:, :lp].to(device), unique[:, lp:].to(device), inverse.to(device),
                completion_ids.to(device), completion_mask.to(device), **kwargs,
            )
    return logps, entropy, t


def _packed_token_logps(
    model: torch.nn.Module, batch: TrainBatch, idx: list[int], config: GRPOConfig, device: torch.device,
    compute_entropy: bool,
) -> tuple[torch.Tensor, torch.Tensor | None, int]:
    """``_token_logps`` with rows ``idx`` packed (prompt + completion each, no padding; ``trainer/packing.py``).

    Each row runs its own prompt (no prompt sharing: a packed row attends only to itself). The log-probs come
    back in the padded ``[b, T']`` layout, 0 on padding, so the loss and its normalisers are the padded path's.
    """
    rows, scored = [], []
    for i in idx:
        prompt = batch.prompt_ids[i][batch.prompt_mask[i].bool()]  # [Lp_i]
        k = int(batch.completion_mask[i].sum())  # |o_i|
        rows.append(torch.cat([prompt, batch.completion_ids[i, :k]]))  # [Lp_i + |o_i|]
        scored.append(torch.arange(len(prompt), len(prompt) + k))  # the completion tokens
    t = max(1, max(len(s) for s in scored))
    packed = pack_rows(rows, scored).to(device)
    with autocast(config, device):
        logps, entropy = compute_packed_logps(
            model, packed, temperature=config.sampling.temperature, chunk_size=config.logprob_chunk_size,
            compute_entropy=compute_entropy,
        )  # [K]
    entropy = packed.unpack(entropy, len(idx), t) if entropy is not None else None  # [b, T']
    return packed.unpack(logps, len(idx), t), entropy, t  # [b, T']


def _micro_batches(batch: TrainBatch, idx: list[int], config: GRPOConfig, lockstep: DistContext | None
                   ) -> list[list[int]]:
    """Rows ``idx`` in micro-batches: by the packed-token budget ``max_tokens_per_batch`` when set, else of
    ``per_device_train_batch_size`` rows."""
    if config.padding_free and config.max_tokens_per_batch is not None:
        lengths = (batch.prompt_mask[idx].sum(1) + batch.completion_mask[idx].sum(1) - 1).tolist()  # fed tokens
        return token_budget_batches(idx, lengths, config.max_tokens_per_batch, lockstep)
    return micro_batches(idx, config.per_device_train_batch_size, lockstep)


@torch.no_grad()
def compute_batch_logps(
    model: torch.nn.Module, batch: TrainBatch, idx: list[int], config: GRPOConfig, device: torch.device,
    ctx: DistContext | None = None,
) -> torch.Tensor:
    """Log-probs ``[N, Tc]`` of rows ``idx`` under ``model`` (other rows 0), micro-batch by micro-batch."""
    out = torch.zeros(batch.completion_ids.shape)  # [N, Tc]
    lockstep = ctx if ctx is not None and is_sharded(model) else None
    for mb in _micro_batches(batch, idx, config, lockstep):
        logps, _, t = _token_logps(model, batch, mb or [0], config, device)  # [] = FSDP filler: run, discard
        if mb:
            out[mb, :t] = logps.float().cpu()  # [b, T']
    if lockstep is not None:
        model.reshard()  # FSDP: no backward follows to reshard the root (see trainer/fsdp.py)
    return out


def optimise(
    model: torch.nn.Module,
    ref_model: torch.nn.Module | None,
    optimizer: torch.optim.Optimizer,
    scheduler: Any,
    batch: TrainBatch,
    config: GRPOConfig,
    ctx: DistContext,
    sampling_correction: bool = False,
) -> dict[str, float]:
    """Run the step's ``num_iterations x steps_per_generation`` optimiser steps; return the step's metrics.

    ``sampling_correction``: weight the loss by the sampler correction (needs the rollouts' log-probs;
    the caller decides whether the sampler differs from the trainer's forward).
    """
    n = len(batch)
    num_chunks = min(config.steps_per_generation or 1, n)
    chunks = [c.tolist() for c in np.array_split(np.arange(n), num_chunks)]
    local_idx = [i for c in chunks for i in shard(c, ctx)]
    sums: dict[str, float] = {}
    extremes: dict[str, float] = {}  # keys ending in /min keep the minimum, others the maximum

    def add(key: str, value: float) -> None:
        sums[key] = sums.get(key, 0.0) + value

    if config.num_iterations > 1 or num_chunks > 1:
        batch.old_logps = compute_batch_logps(model, batch, local_idx, config, ctx.device, ctx)
    reference_s = 0.0  # the reference forward's seconds here (0 when the sampler computed them)
    if needs_reference(config) and batch.ref_logps is None:  # else the sampler computed them (async_rollouts)
        if ref_model is None and not is_peft_model(model):
            raise ValueError(f"beta={config.beta} > 0 needs the reference model's log-probs: pass ref_model to "
                             "optimise, or rollouts carrying ref_logprobs (async_reference_on_sampler)")
        start = time.perf_counter()
        # LoRA: the reference is the policy with its adapter disabled (no second copy; trainer/lora.py)
        with contextlib.nullcontext(ref_model) if ref_model is not None else reference_view(model) as reference:
            batch.ref_logps = compute_batch_logps(reference, batch, local_idx, config, ctx.device, ctx)
        reference_s = time.perf_counter() - start

    sharded = is_sharded(model)
    for iteration in range(config.num_iterations):
        for chunk in chunks:
            num_sequences = len(chunk)
            num_tokens = max(1, int(batch.loss_mask[chunk].sum()))
            step_loss = 0.0
            for mb in _micro_batches(batch, shard(chunk, ctx), config, ctx if sharded else None):
                first_pass = iteration == 0
                logps, entropy, t = _token_logps(model, batch, mb or chunk[:1], config, ctx.device, first_pass)  # [b, T']
                if not mb:  # FSDP filler: this rank has fewer sequences; join the collectives, add 0
                    (logps.sum() * 0.0).backward()
                    continue
                loss_mask = batch.loss_mask[mb, :t].to(ctx.device)  # [b, T']
                old = batch.old_logps[mb, :t].to(ctx.device) if batch.old_logps is not None else None
                ref = batch.ref_logps[mb, :t].to(ctx.device) if batch.ref_logps is not None else None
                is_weights = None
                if batch.sampling_logps is not None and (sampling_correction or first_pass):
                    trainer_old = old if old is not None else logps.detach().float()  # [b, T'] pi_old
                    # the sampled tokens: a tool token's sampler log-prob is a 0.0 placeholder (sequence modes sum)
                    comp_mask = batch.sampled_mask[mb, :t].to(ctx.device)  # [b, T']
                    is_weights, is_metrics = compute_sampling_correction(
                        trainer_old, batch.sampling_logps[mb, :t].to(ctx.device), comp_mask,
                        mode=config.vllm_importance_sampling_mode, clip_min=config.vllm_importance_sampling_clip_min,
                        clip_max=config.vllm_importance_sampling_clip_max,
                    )
                    if first_pass:
                        _add_sampling_metrics(is_metrics, float(comp_mask.sum()), len(mb), sampling_correction,
                                              config.vllm_importance_sampling_mode, add, extremes)
                    if not sampling_correction:
                        is_weights = None
                loss, metrics = compute_policy_loss(
                    logps.float(), old, ref, batch.advantages[mb].to(ctx.device), loss_mask,
                    epsilon=config.epsilon, epsilon_high=config.epsilon_high, beta=config.beta,
                    loss_type=config.loss_type, importance_sampling_level=config.importance_sampling_level,
                    max_completion_length=config.sampling.max_completion_length,
                    num_sequences=num_sequences, num_tokens=num_tokens, importance_sampling_ratio=is_weights,
                )
                loss.backward()
                step_loss += loss.item()
                tokens = float(loss_mask.sum())
                add("tokens", tokens)
                for key, value in metrics.items():
                    add(key, value * tokens)
                if first_pass:
                    comp_mask = batch.sampled_mask[mb, :t].to(ctx.device).float()  # [b, T'] the policy's own tokens
                    add("entropy", float((entropy.detach().float() * comp_mask).sum()))
                    add("entropy_tokens", float(comp_mask.sum()))
            add("loss", step_loss)
            add("learning_rate", scheduler.get_last_lr()[0] / ctx.world_size)  # summed over ranks below
            grad_norm = optimizer_step(model, optimizer, scheduler, config.max_grad_norm, ctx)
            add("grad_norm", grad_norm / ctx.world_size)
    return {**_reduce_metrics(sums, extremes, num_updates=config.num_iterations * num_chunks, ctx=ctx),
            "time/reference": reference_s}


_DIFF, _RATIO = "sampling/sampling_logp_difference/", "sampling/importance_sampling_ratio/"


def _add_sampling_metrics(metrics: dict[str, float], tokens: float, rows: int, with_ratio: bool, mode: str,
                          add: Any, extremes: dict[str, float]) -> None:
    """Accumulate one micro-batch's sampler-gap metrics: means as count-weighted sums, min/max as extremes."""
    ratio_count = tokens if mode.startswith("token") else float(rows)  # TRL: ratios over tokens, or sequences
    parts = [(_DIFF, tokens)] + ([(_RATIO, ratio_count)] if with_ratio else [])
    for prefix, count in parts:
        if not count:
            continue
        add(prefix + "sum", metrics[prefix + "mean"] * count)
        add(prefix + "count", count)
        for key in (prefix + "min", prefix + "max"):
            if key in metrics:
                pick = min if key.endswith("/min") else max
                extremes[key] = pick(extremes.get(key, metrics[key]), metrics[key])


def _reduce_metrics(sums: dict[str, float], extremes: dict[str, float], num_updates: int, ctx: DistContext) -> dict[str, float]:
    """Combine every rank's sums (and extremes: minima for keys ending in /min, else maxima) into the step's metrics."""
    total: dict[str, float] = {}
    top: dict[str, float] = {}
    for part_sums, part_extremes in gather_objects([(sums, extremes)], ctx):
        for k, v in part_sums.items():
            total[k] = total.get(k, 0.0) + v
        for k, v in part_extremes.items():
            top[k] = (min if k.endswith("/min") else max)(top.get(k, v), v)
    tokens = max(total.get("tokens", 0.0), 1.0)
    out = {
        "loss": total.get("loss", 0.0) / num_updates,
        "grad_norm": total.get("grad_norm", 0.0) / num_updates,
        "learning_rate": total.get("learning_rate", 0.0) / num_updates,
    }
    for key in ("kl", "clip_ratio/low_mean", "clip_ratio/high_mean", "clip_ratio/region_mean"):
        out[key] = total.get(key, 0.0) / tokens
    if total.get("entropy_tokens"):
        out["entropy"] = total["entropy"] / total["entropy_tokens"]
    for prefix in (_DIFF, _RATIO):
        if total.get(prefix + "count"):
            out[prefix + "mean"] = total[prefix + "sum"] / total[prefix + "count"]
    out.update(top)
    return out
